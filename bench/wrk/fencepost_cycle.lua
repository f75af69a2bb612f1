-- (a) fencepost: acquire a fresh lock, release it, repeat (one connection per wrk thread).
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local lib = dofile(dir .. "lib.lua")
local key = os.getenv("FENCEPOST_API_KEY")
setup, done = lib.setup, lib.done
local acquiring, lock, token = true, nil, nil

function init(args)
  lib.init()
end

function request()
  if acquiring then
    lock, token = lib.next_name("a"), lib.uuid()
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
  if acquiring then
    if status == 201 then lib.good(); acquiring = false else lib.unexpected(status, body) end
  else
    acquiring = true
    if status == 200 and body:find('"released":true', 1, true) then
      lib.good()
    else
      lib.unexpected(status, body)
    end
  end
end
