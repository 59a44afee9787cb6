//! The Lua scripts behind each store operation: one atomic round trip per
//! transition, reading the clock of Redis itself.

use redis::Script;

// Every script reads the clock of Redis itself (`TIME`), so gateways with
// skewed clocks agree on leases — but only when it needs it: a completed
// record's answer does not depend on the time, so a replay's begin (and a
// get) reads the record first and the clock only for an in-flight one. An
// in-flight record keeps its lease end in `until` and lives for two lease
// lengths: after `until` it counts as absent for every purpose, but a begin
// with the same fingerprint within that second lease length is recognised
// (and counted) as a takeover.
//
// Redis's own cost is mostly Lua: measured with callgrind, each
// `redis.call` is a few thousand instructions and each number Lua turns
// back into text (`now + lease`) about two thousand, so the scripts make as
// few calls as the transition needs and the client passes every length
// already as text (`ARGV`), computing `2 × lease` itself.
const NOW: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
";

// The record found, as `begin` and `get` answer with it: packed into one
// bulk string (`reply.rs` reads it), or as the five fields when it does not
// fit the packing, so that the record codec can say what is wrong with it.
const ANSWER: &str = r"
local function answer(r, remaining)
  if r[2] and #r[2] == 32 and (r[1] == 'c' or r[1] == 'u' or r[1] == 'i') then
    return r[1] .. r[2] .. (r[4] and '1' or '0') .. (r[3] or '') .. ':' .. remaining .. ':' .. (r[4] or '')
  end
  return {r[1], r[2], r[3] or '', r[4] or false, remaining}
end
";

// KEYS[1]; ARGV: fingerprint, fence, lease ms, 2 × lease ms.
const BEGIN: &str = r"
local r = redis.call('HMGET', KEYS[1], 'st', 'fp', 'fence', 'resp', 'until')
if r[1] and r[1] ~= 'i' then return answer(r, '0') end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local took = false
if r[1] == 'i' and tonumber(r[5]) <= now then
  took = (r[2] == ARGV[1])
  r[1] = false
end
if not r[1] then
  -- Only a lapsed attempt (or a hash without a state) leaves fields behind.
  if r[2] or r[3] or r[4] or r[5] then redis.call('DEL', KEYS[1]) end
  redis.call('HSET', KEYS[1], 'st', 'i', 'fp', ARGV[1], 'fence', ARGV[2], 'until', now + tonumber(ARGV[3]))
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  if took then return 'taken_over' end
  return 'acquired'
end
return answer(r, tonumber(r[5]) - now)
";

const GET: &str = r"
local r = redis.call('HMGET', KEYS[1], 'st', 'fp', 'fence', 'resp', 'until')
if not r[1] then return false end
local remaining = '0'
if r[1] == 'i' then
  local t = redis.call('TIME')
  remaining = tonumber(r[5]) - (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  if remaining <= 0 then return false end
end
return answer(r, remaining)
";

// The fenced transitions share one guard: the record is in flight under
// ARGV[1] and its lease has not run out.
const HELD: &str = r"
local r = redis.call('HMGET', KEYS[1], 'st', 'fence', 'until')
if r[1] ~= 'i' or r[2] ~= ARGV[1] or tonumber(r[3]) <= now then return 0 end
";

// ARGV: fence, lease ms, 2 × lease ms.
const RENEW: &str = r"
redis.call('HSET', KEYS[1], 'until', now + tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
";

// ARGV: fence, ttl ms, the new state ('c' or 'u'), fingerprint, then the
// stored response when one is kept. No clock: a complete under its own
// fence lands whether its lease is live or lapsed, and one that finds no
// record creates it (a lapsed record expired during a long outage, and
// nobody took over: a takeover writes its own fence). Another fence, or a
// record completed by another attempt, answers 0. A record this fence
// already settled answers 2 and is left as it is: a complete whose WAIT
// fell short is sent again by the same attempt, and must learn that its
// write stands (only the replicas are waited for again).
const COMPLETE: &str = r"
local r = redis.call('HMGET', KEYS[1], 'st', 'fence')
if r[1] then
  if r[2] ~= ARGV[1] then return 0 end
  if r[1] == 'c' or r[1] == 'u' then return 2 end
  if r[1] ~= 'i' then return 0 end
  if ARGV[5] then
    redis.call('HSET', KEYS[1], 'st', ARGV[3], 'resp', ARGV[5])
  else
    redis.call('HSET', KEYS[1], 'st', ARGV[3])
  end
  redis.call('HDEL', KEYS[1], 'until')
else
  -- A hash without a state is no record; nothing of it is kept.
  if r[2] then redis.call('DEL', KEYS[1]) end
  if ARGV[5] then
    redis.call('HSET', KEYS[1], 'st', ARGV[3], 'fp', ARGV[4], 'fence', ARGV[1], 'resp', ARGV[5])
  else
    redis.call('HSET', KEYS[1], 'st', ARGV[3], 'fp', ARGV[4], 'fence', ARGV[1])
  end
end
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
            begin: Script::new(&[ANSWER, BEGIN].concat()),
            get: Script::new(&[ANSWER, GET].concat()),
            renew: Script::new(&[NOW, HELD, RENEW].concat()),
            complete: Script::new(COMPLETE),
            release: Script::new(&[NOW, HELD, RELEASE].concat()),
        }
    }
}
