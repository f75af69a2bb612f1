-- (c) etcd: every connection runs the create-if-absent txn on one key; the
-- winner deletes it (compare value == my token) and tries again.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local lib = dofile(dir .. "lib.lua")
local api = os.getenv("ETCD_API") or "/v3"
setup, done = lib.setup, lib.done
local lease, holding, k64, v64 = nil, false, nil, nil
local json = { ["Content-Type"] = "application/json" }

function init(args)
  lib.init()
  k64 = lib.base64("hot-" .. nonce)
end

function request()
  if lease == nil then
    return wrk.format("POST", api .. "/lease/grant", json, '{"TTL": 60}')
  end
  if not holding then
    v64 = lib.base64(lib.uuid())
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
  elseif status ~= 200 then
    lib.unexpected(status, body); holding = false
  elseif not holding then
    lib.good()
    if body:find('"succeeded":true', 1, true) then
      granted = granted + 1; holding = true
    else
      denied = denied + 1
    end
  else
    holding = false
    if body:find('"succeeded":true', 1, true) then lib.good() else lib.unexpected(status, body) end
  end
end
