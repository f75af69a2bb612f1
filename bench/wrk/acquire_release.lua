-- wrk script: each connection alternates acquire and release of a random lock.
-- Usage: FENCEPOST_API_KEY=... wrk -t2 -c64 -d10s -s bench/wrk/acquire_release.lua http://127.0.0.1:7440
local key = os.getenv("FENCEPOST_API_KEY")
local counter = 0

local function uuid()
  local t = "xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx"
  return (t:gsub("[xy]", function(c)
    local v = (c == "x") and math.random(0, 15) or math.random(8, 11)
    return string.format("%x", v)
  end))
end

function setup(thread)
  counter = counter + 1
  thread:set("id", counter)
end

function init(args)
  math.randomseed(os.time() * 1000 + id)
  acquiring = true
end

function request()
  if acquiring then
    lock = "bench-" .. math.random(1, 1000000000)
    token = uuid()
    acquiring = false
    return wrk.format("PUT", "/v1/locks/" .. lock .. "/lease", {
      ["Authorization"] = "Bearer " .. key,
      ["X-Lock-Token"] = token,
      ["X-Request-Id"] = uuid(),
      ["Content-Type"] = "application/json",
    }, '{"ttl_seconds": 30}')
  end
  acquiring = true
  return wrk.format("DELETE", "/v1/locks/" .. lock .. "/lease", {
    ["Authorization"] = "Bearer " .. key,
    ["X-Lock-Token"] = token,
  })
end

function response(status, headers, body)
  if status >= 300 then
    errors_seen = (errors_seen or 0) + 1
    if errors_seen < 5 then print("unexpected status " .. status .. ": " .. body) end
  end
end
