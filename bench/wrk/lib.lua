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

local random, format, floor = math.random, string.format, math.floor

-- A version-4 UUID (random enough for lock tokens and request IDs).
function lib.uuid()
  return format("%04x%04x-%04x-4%03x-%04x-%04x%04x%04x",
    random(0, 0xffff), random(0, 0xffff), random(0, 0xffff), random(0, 0xfff),
    random(0x8000, 0xbfff), random(0, 0xffff), random(0, 0xffff), random(0, 0xffff))
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

local b64 = {}
for i = 1, 64 do
  b64[i - 1] = ("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"):sub(i, i)
end

-- etcd's JSON gateway wants keys and values in base64.
function lib.base64(data)
  local out = {}
  for i = 1, #data, 3 do
    local a, b, c = data:byte(i, i + 2)
    local n = a * 65536 + (b or 0) * 256 + (c or 0)
    out[#out + 1] = b64[floor(n / 262144)] .. b64[floor(n / 4096) % 64] ..
      (b and b64[floor(n / 64) % 64] or "=") .. (c and b64[n % 64] or "=")
  end
  return table.concat(out)
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
