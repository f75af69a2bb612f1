-- (b) fencepost: each connection acquires one lease, then renews it over and over.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local lib = dofile(dir .. "lib.lua")
local key = os.getenv("FENCEPOST_API_KEY")
setup, done = lib.setup, lib.done
local held, lock, token = false, nil, nil

function init(args)
  lib.init()
  lock, token = lib.next_name("b"), lib.uuid()
end

function request()
  local headers = {
    ["Authorization"] = "Bearer " .. key,
    ["X-Lock-Token"] = token,
    ["X-Request-Id"] = lib.uuid(),
    ["Content-Type"] = "application/json",
  }
  if not held then
    return wrk.format("PUT", "/v1/locks/" .. lock .. "/lease", headers, '{"ttl_seconds": 60}')
  end
  return wrk.format("PATCH", "/v1/locks/" .. lock .. "/lease", headers, '{"ttl_seconds": 60}')
end

function response(status, headers, body)
  if not held then
    if status == 201 or status == 200 then lib.good(); held = true else lib.unexpected(status, body) end
  elseif status == 200 then
    lib.good()
  else
    lib.unexpected(status, body)
  end
end
