-- Shared by the bench/wrk/*.lua workload scripts.
--
-- wrk keeps one Lua state per *thread*, and request()/response() do not say
-- which connection they belong to. The harness therefore runs wrk with as many
-- threads as connections (-t64 -c64): one connection per thread, so the
-- globals below are that connection's own state and a request sequence
-- (acquire, then release of that same lease) is exact.
--
-- Every script counts its outcomes in the thread globals `ok`, `bad`,
-- `granted` and `denied`; done() sums them over threads and prints one line
-- `BENCH_RESULT {json}` that bench/fpbench/loadgen.py parses.

local lib = {}
local threads = {}

ok, bad, granted, denied, shown = 0, 0, 0, 0, 0

function lib.setup(thread)
  table.insert(threads, thread)
  thread:set("id", #threads)
end

function lib.init()
  math.randomseed(os.time() * 1000 + id)
  nonce = os.getenv("BENCH_NONCE") or tostring(os.time())
  seq = 0
end

-- Deterministic, collision-free names: run nonce, connection id, sequence.
function lib.next_name(prefix)
  seq = seq + 1
  return prefix .. "-" .. nonce .. "-" .. id .. "-" .. seq
end

function lib.uuid()
  local t = "xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx"
  return (t:gsub("[xy]", function(c)
    local v = (c == "x") and math.random(0, 15) or math.random(8, 11)
    return string.format("%x", v)
  end))
end

function lib.good()
  ok = ok + 1
end

-- An answer the workload did not expect: counted, and the first few shown.
function lib.unexpected(status, body)
  bad = bad + 1
  if shown < 3 then
    shown = shown + 1
    io.write("unexpected: " .. status .. " " .. string.sub(body or "", 1, 300) .. "\n")
  end
end

local b64chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

function lib.base64(data)
  return ((data:gsub(".", function(x)
    local r, b = "", x:byte()
    for i = 8, 1, -1 do r = r .. (b % 2 ^ i - b % 2 ^ (i - 1) > 0 and "1" or "0") end
    return r
  end) .. "0000"):gsub("%d%d%d?%d?%d?%d?", function(x)
    if #x < 6 then return "" end
    local c = 0
    for i = 1, 6 do c = c + (x:sub(i, i) == "1" and 2 ^ (6 - i) or 0) end
    return b64chars:sub(c + 1, c + 1)
  end) .. ({ "", "==", "=" })[#data % 3 + 1])
end

function lib.done(summary, latency, requests)
  local sums = { ok = 0, bad = 0, granted = 0, denied = 0 }
  for _, thread in ipairs(threads) do
    for name, _ in pairs(sums) do
      sums[name] = sums[name] + (thread:get(name) or 0)
    end
  end
  local e = summary.errors
  io.write(string.format(
    'BENCH_RESULT {"requests": %d, "duration_us": %d, "p50_us": %d, "p90_us": %d, ' ..
    '"p99_us": %d, "max_us": %d, "mean_us": %.1f, "ok": %d, "unexpected": %d, ' ..
    '"granted": %d, "denied": %d, "socket_errors": %d, "non_2xx_3xx": %d}\n',
    summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    latency.mean, sums.ok, sums.bad, sums.granted, sums.denied,
    e.connect + e.read + e.write + e.timeout, e.status))
end

return lib
