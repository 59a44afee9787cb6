-- wrk script for the throughput scenarios, configured by environment:
--   LT_METHOD  GET or POST                      (default GET)
--   LT_KEYS    none | unique | cycle            (default none)
--   LT_SPACE   with cycle: keys per thread      (default 1000)
--   LT_PREFIX  key prefix, unique per run       (default "lt")
--   LT_BODY    request body for POST            (default {"amount":500})
-- unique: every request carries a new Idempotency-Key (first requests);
-- cycle: each thread walks LT_SPACE keys over and over (after the first
-- pass, every request is a replay of a completed key).
-- done() prints one JSON line, prefixed "LTJSON ", for load-tests/run.

local method = os.getenv("LT_METHOD") or "GET"
local mode = os.getenv("LT_KEYS") or "none"
local space = tonumber(os.getenv("LT_SPACE") or "1000")
local prefix = os.getenv("LT_PREFIX") or "lt"
local body = nil
local headers = {}
if method == "POST" then
  body = os.getenv("LT_BODY") or '{"amount":500}'
  headers["Content-Type"] = "application/json"
end

local threads = {}
local counter = 0
-- `id` is a global that setup() sets in each thread's own Lua state.

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  if mode == "none" then
    -- One request, formatted once: the cheapest wrk can be.
    local fixed = wrk.format(method, "/v1/charges", headers, body)
    request = function() return fixed end
  end
end

function request()
  counter = counter + 1
  local n = counter
  if mode == "cycle" then n = counter % space end
  headers["Idempotency-Key"] = prefix .. "-" .. id .. "-" .. n
  return wrk.format(method, "/v1/charges", headers, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'LTJSON {"requests":%d,"duration_us":%d,"connect_errors":%d,"read_errors":%d,"write_errors":%d,' ..
    '"status_errors":%d,"timeouts":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"p999_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9), latency.max))
end
