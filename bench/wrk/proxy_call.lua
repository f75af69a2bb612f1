-- Proxy mode's overhead: the same call sent straight to the upstream or
-- through a fencepost pool (the harness gives the path). BENCH_METHOD and
-- BENCH_BODY_BYTES shape the request; BENCH_AUTH, when set, is sent as the
-- Authorization header (the fencepost key for the proxied run).
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local lib = dofile(dir .. "lib.lua")
local method = os.getenv("BENCH_METHOD") or "GET"
local path = os.getenv("BENCH_PATH") or "/"
local auth = os.getenv("BENCH_AUTH")
local body_bytes = tonumber(os.getenv("BENCH_BODY_BYTES") or "0")
setup, done = lib.setup, lib.done
local body = nil
local headers = {}

function init(args)
  lib.init()
  if body_bytes > 0 then
    body = string.rep("x", body_bytes)
    headers["Content-Type"] = "application/octet-stream"
  end
  if auth and auth ~= "" then
    headers["Authorization"] = "Bearer " .. auth
  end
end

function request()
  return wrk.format(method, path, headers, body)
end

function response(status, headers, body)
  if status == 200 then
    lib.good(); granted = granted + 1
  else
    lib.unexpected(status, body)
  end
end
