-- (c) fencepost: every connection fights for one lock with fail-fast acquires
-- (201 granted or 409 lock_held, both count as operations) and releases when granted.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local lib = dofile(dir .. "lib.lua")
local key = os.getenv("FENCEPOST_API_KEY")
setup, done = lib.setup, lib.done
local holding, lock, token = false, nil, nil

function init(args)
  lib.init()
  lock = "hot-" .. nonce
end

function request()
  if not holding then
    token = lib.uuid()
    return wrk.format("PUT", "/v1/locks/" .. lock .. "/lease", {
      ["Authorization"] = "Bearer " .. key,
      ["X-Lock-Token"] = token,
      ["X-Request-Id"] = lib.uuid(),
      ["Content-Type"] = "application/json",
    }, '{"ttl_seconds": 30}')
  end
  return wrk.format("DELETE", "/v1/locks/" .. lock .. "/lease", {
    ["Authorization"] = "Bearer " .. key,
    ["X-Lock-Token"] = token,
  })
end

function response(status, headers, body)
  if not holding then
    if status == 201 then
      lib.good(); granted = granted + 1; holding = true
    elseif status == 409 then
      lib.good(); denied = denied + 1
    else
      lib.unexpected(status, body)
    end
  else
    holding = false
    if status == 200 and body:find('"released":true', 1, true) then
      lib.good()
    else
      lib.unexpected(status, body)
    end
  end
end
