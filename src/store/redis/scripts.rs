//! The Lua scripts behind each store operation: one atomic round trip per
//! transition, reading the clock of Redis itself.

use redis::Script;

// Every script reads the clock of Redis itself (`TIME`), so gateways with
// skewed clocks agree on leases. An in-flight record keeps its lease end in
// `until` and lives for two lease lengths: after `until` it counts as absent
// for every purpose, but a begin with the same fingerprint within that
// second lease length is recognised (and counted) as a takeover.
const NOW: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
";

// KEYS[1]; ARGV: fingerprint, fence, lease ms.
const BEGIN: &str = r"
local r = redis.call('HMGET', KEYS[1], 'st', 'fp', 'fence', 'resp', 'until')
local took = false
if r[1] == 'i' and tonumber(r[5]) <= now then
  took = (r[2] == ARGV[1])
  r[1] = false
end
if not r[1] then
  local lease = tonumber(ARGV[3])
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'st', 'i', 'fp', ARGV[1], 'fence', ARGV[2], 'until', now + lease)
  redis.call('PEXPIRE', KEYS[1], 2 * lease)
  if took then return 'taken_over' end
  return 'acquired'
end
local remaining = 0
if r[1] == 'i' then remaining = tonumber(r[5]) - now end
return {r[1], r[2], r[3] or '', r[4] or false, remaining}
";

const GET: &str = r"
local r = redis.call('HMGET', KEYS[1], 'st', 'fp', 'fence', 'resp', 'until')
if not r[1] then return false end
local remaining = 0
if r[1] == 'i' then
  remaining = tonumber(r[5]) - now
  if remaining <= 0 then return false end
end
return {r[1], r[2], r[3] or '', r[4] or false, remaining}
";

// The fenced transitions share one guard: the record is in flight under
// ARGV[1] and its lease has not run out.
const HELD: &str = r"
local r = redis.call('HMGET', KEYS[1], 'st', 'fence', 'until')
if r[1] ~= 'i' or r[2] ~= ARGV[1] or tonumber(r[3]) <= now then return 0 end
";

// ARGV: fence, lease ms.
const RENEW: &str = r"
redis.call('HSET', KEYS[1], 'until', now + tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[2]))
return 1
";

// A complete's own guard: as HELD, but a record this fence already
// settled answers 2 and is left as it is. A complete whose WAIT fell short
// is sent again by the same attempt, and must learn that its write stands
// (only the replicas are waited for again), not that it was fenced out.
const HELD_OR_SETTLED: &str = r"
local r = redis.call('HMGET', KEYS[1], 'st', 'fence', 'until')
if r[2] ~= ARGV[1] then return 0 end
if r[1] == 'c' or r[1] == 'u' then return 2 end
if r[1] ~= 'i' or tonumber(r[3]) <= now then return 0 end
";

// ARGV: fence, ttl ms, the new state ('c' or 'u'), then the stored response
// when one is kept.
const COMPLETE: &str = r"
redis.call('HSET', KEYS[1], 'st', ARGV[3])
redis.call('HDEL', KEYS[1], 'until')
if ARGV[4] then redis.call('HSET', KEYS[1], 'resp', ARGV[4]) end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
";

// ARGV: fence.
const RELEASE: &str = r"
redis.call('DEL', KEYS[1])
return 1
";

/// The scripts, loaded once per store (`EVALSHA`, with `EVAL` on a miss).
pub(super) struct Scripts {
    pub(super) begin: Script,
    pub(super) get: Script,
    pub(super) renew: Script,
    pub(super) complete: Script,
    pub(super) release: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Self {
            begin: Script::new(&[NOW, BEGIN].concat()),
            get: Script::new(&[NOW, GET].concat()),
            renew: Script::new(&[NOW, HELD, RENEW].concat()),
            complete: Script::new(&[NOW, HELD_OR_SETTLED, COMPLETE].concat()),
            release: Script::new(&[NOW, HELD, RELEASE].concat()),
        }
    }
}
