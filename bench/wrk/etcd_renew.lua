-- (b) etcd: each connection grants a lease and attaches a key to it, then
-- renews the lease over and over with the gateway's /lease/keepalive.
-- (etcd answers a keepalive from the leader's memory without a raft write.)
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local lib = dofile(dir .. "lib.lua")
local api = os.getenv("ETCD_API") or "/v3"
setup, done = lib.setup, lib.done
local lease, held = nil, false
local json = { ["Content-Type"] = "application/json" }

function init(args)
  lib.init()
end

function request()
  if lease == nil then
    return wrk.format("POST", api .. "/lease/grant", json, '{"TTL": 60}')
  end
  if not held then
    local k64, v64 = lib.base64(lib.next_name("b")), lib.base64(lib.uuid())
    return wrk.format("POST", api .. "/kv/txn", json,
      '{"compare":[{"key":"' .. k64 .. '","target":"CREATE","result":"EQUAL","create_revision":"0"}],' ..
      '"success":[{"requestPut":{"key":"' .. k64 .. '","value":"' .. v64 .. '","lease":"' .. lease .. '"}}]}')
  end
  return wrk.format("POST", api .. "/lease/keepalive", json, '{"ID":"' .. lease .. '"}')
end

function response(status, headers, body)
  if lease == nil then
    lease = body:match('"ID":"(%d+)"')
    if status == 200 and lease then lib.good() else lib.unexpected(status, body) end
  elseif not held then
    if status == 200 and body:find('"succeeded":true', 1, true) then
      lib.good(); held = true
    else
      lib.unexpected(status, body)
    end
  elseif status == 200 and body:find('"TTL":"60"', 1, true) then
    lib.good()
  else
    lib.unexpected(status, body)
  end
end
