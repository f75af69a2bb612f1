-- (d) fencepost: fail-fast slot acquire on one pool (the harness creates it with
-- limit = connections, so a slot is normally free), then release that slot.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local lib = dofile(dir .. "lib.lua")
local key = os.getenv("FENCEPOST_API_KEY")
local pool = os.getenv("BENCH_POOL")
setup, done = lib.setup, lib.done
local slot = nil

function init(args)
  lib.init()
end

function request()
  local headers = { ["Authorization"] = "Bearer " .. key }
  if slot == nil then
    return wrk.format("POST", "/v1/pools/" .. pool .. "/lock/acquire", headers)
  end
  return wrk.format("POST", "/v1/pools/" .. pool .. "/lock/" .. slot .. "/release", headers)
end

function response(status, headers, body)
  if slot == nil then
    if status == 200 then
      slot = body:match('"slot_id":"([^"]+)"')
      if slot then lib.good(); granted = granted + 1 else lib.unexpected(status, body) end
    elseif status == 429 then
      lib.good(); denied = denied + 1
    else
      lib.unexpected(status, body)
    end
  else
    slot = nil
    if status == 200 and body:find('"released":true', 1, true) then
      lib.good()
    else
      lib.unexpected(status, body)
    end
  end
end
