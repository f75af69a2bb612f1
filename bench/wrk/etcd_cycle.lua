-- (a) etcd through its HTTP/JSON gateway, the way etcd's own lock recipe works:
-- one lease per client session (granted first), then for each lock a txn
-- "create if absent (create_revision == 0) -> put with the lease", and a txn
-- "delete if the value is still my token" to release.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local lib = dofile(dir .. "lib.lua")
local api = os.getenv("ETCD_API") or "/v3"
setup, done = lib.setup, lib.done
local lease, acquiring, k64, v64 = nil, true, nil, nil
local json = { ["Content-Type"] = "application/json" }

function init(args)
  lib.init()
end

function request()
  if lease == nil then
    return wrk.format("POST", api .. "/lease/grant", json, '{"TTL": 60}')
  end
  if acquiring then
    k64, v64 = lib.base64(lib.next_name("a")), lib.base64(lib.uuid())
    return wrk.format("POST", api .. "/kv/txn", json,
      '{"compare":[{"key":"' .. k64 .. '","target":"CREATE","result":"EQUAL","create_revision":"0"}],' ..
      '"success":[{"requestPut":{"key":"' .. k64 .. '","value":"' .. v64 .. '","lease":"' .. lease .. '"}}]}')
  end
  return wrk.format("POST", api .. "/kv/txn", json,
    '{"compare":[{"key":"' .. k64 .. '","target":"VALUE","result":"EQUAL","value":"' .. v64 .. '"}],' ..
    '"success":[{"requestDeleteRange":{"key":"' .. k64 .. '"}}]}')
end

function response(status, headers, body)
  if lease == nil then
    lease = body:match('"ID":"(%d+)"')
    if status == 200 and lease then lib.good() else lib.unexpected(status, body) end
  elseif status == 200 and body:find('"succeeded":true', 1, true) then
    lib.good(); acquiring = not acquiring
  else
    lib.unexpected(status, body); acquiring = true
  end
end
