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

// With a tenant quota, the writing scripts take two more keys of the
// record's tenant: KEYS[2], a sorted set of the tenant's record keys scored
// by when each expires (ms, Redis's clock, the record's own PEXPIRE), and
// KEYS[3], a hash of those records' stored bytes with their sum in field
// `*`. Every script that sets or ends a record's life updates both in the
// same step, so "count, then insert" is one atomic step. Members whose
// score has passed are records Redis has expired: a begin counts only live
// members (`ZCOUNT`, no walk) and prunes a bounded number of dead ones,
// returning their bytes. The tenant's keys live as long as their longest
// member.
const TENANT: &str = r"
local function drop_bytes(m)
  local b = redis.call('HGET', KEYS[3], m)
  if b then
    redis.call('HDEL', KEYS[3], m)
    redis.call('HINCRBY', KEYS[3], '*', -tonumber(b))
  end
end
local function forget(m)
  redis.call('ZREM', KEYS[2], m)
  drop_bytes(m)
end
local function prune(now, most)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, most)
  for _, m in ipairs(gone) do drop_bytes(m) end
  if #gone > 0 then redis.call('ZREM', KEYS[2], unpack(gone)) end
end
local function outlive(ms)
  for i = 2, 3 do
    if redis.call('PTTL', KEYS[i]) < tonumber(ms) then redis.call('PEXPIRE', KEYS[i], ms) end
  end
end
local function bytes_held()
  return tonumber(redis.call('HGET', KEYS[3], '*') or '0')
end
";

// KEYS[1..3]; ARGV: fingerprint, fence, lease ms, 2 × lease ms, max keys,
// max bytes. As BEGIN, but a key the tenant's store does not hold at all
// (no hash: a lapsed attempt's hash still counts and passes its place on)
// is refused, writing nothing, while the tenant holds max keys live
// records or max bytes. The bytes are pruned further before a refusal, so
// a tenant whose responses expired gets its bytes back.
const BEGIN_IN_QUOTA: &str = r"
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
  if r[2] or r[3] or r[4] or r[5] then
    redis.call('DEL', KEYS[1])
    drop_bytes(KEYS[1])
  else
    prune(now, 100)
    if redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf') >= tonumber(ARGV[5]) then return 'quota_keys' end
    if bytes_held() >= tonumber(ARGV[6]) then
      prune(now, 1000)
      if bytes_held() >= tonumber(ARGV[6]) then return 'quota_bytes' end
    end
  end
  redis.call('HSET', KEYS[1], 'st', 'i', 'fp', ARGV[1], 'fence', ARGV[2], 'until', now + tonumber(ARGV[3]))
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), KEYS[1])
  outlive(ARGV[4])
  if took then return 'taken_over' end
  return 'acquired'
end
return answer(r, tonumber(r[5]) - now)
";

const RENEW_IN_QUOTA: &str = r"
redis.call('HSET', KEYS[1], 'until', now + tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), KEYS[1])
outlive(ARGV[3])
return 1
";

// As COMPLETE (never refused for the quota: the upstream acted), and the
// record's expiry and stored bytes are noted for its tenant.
const COMPLETE_IN_QUOTA: &str = r"
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
  if r[2] then redis.call('DEL', KEYS[1]) end
  if ARGV[5] then
    redis.call('HSET', KEYS[1], 'st', ARGV[3], 'fp', ARGV[4], 'fence', ARGV[1], 'resp', ARGV[5])
  else
    redis.call('HSET', KEYS[1], 'st', ARGV[3], 'fp', ARGV[4], 'fence', ARGV[1])
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), KEYS[1])
drop_bytes(KEYS[1])
if ARGV[5] and #ARGV[5] > 0 then
  redis.call('HSET', KEYS[3], KEYS[1], #ARGV[5])
  redis.call('HINCRBY', KEYS[3], '*', #ARGV[5])
end
outlive(ARGV[2])
return 1
";

const RELEASE_IN_QUOTA: &str = r"
redis.call('DEL', KEYS[1])
forget(KEYS[1])
return 1
";

const PURGE_IN_QUOTA: &str = r"
local n = redis.call('DEL', KEYS[1])
forget(KEYS[1])
return n
";

/// The scripts, loaded once per store (`EVALSHA`, with `EVAL` on a miss).
pub(super) struct Scripts {
    pub(super) begin: Script,
    pub(super) get: Script,
    pub(super) renew: Script,
    pub(super) complete: Script,
    pub(super) release: Script,
    /// With a tenant quota (three keys each), or `None`.
    pub(super) in_quota: Option<QuotaScripts>,
}

/// The writing scripts of a store with a tenant quota.
pub(super) struct QuotaScripts {
    pub(super) begin: Script,
    pub(super) renew: Script,
    pub(super) complete: Script,
    pub(super) release: Script,
    pub(super) purge: Script,
}

impl Scripts {
    pub(super) fn new(quota: bool) -> Self {
        Self {
            begin: Script::new(&[ANSWER, BEGIN].concat()),
            get: Script::new(&[ANSWER, GET].concat()),
            renew: Script::new(&[NOW, HELD, RENEW].concat()),
            complete: Script::new(COMPLETE),
            release: Script::new(&[NOW, HELD, RELEASE].concat()),
            in_quota: quota.then(|| QuotaScripts {
                begin: Script::new(&[ANSWER, TENANT, BEGIN_IN_QUOTA].concat()),
                renew: Script::new(&[TENANT, NOW, HELD, RENEW_IN_QUOTA].concat()),
                complete: Script::new(&[TENANT, COMPLETE_IN_QUOTA].concat()),
                release: Script::new(&[TENANT, NOW, HELD, RELEASE_IN_QUOTA].concat()),
                purge: Script::new(&[TENANT, PURGE_IN_QUOTA].concat()),
            }),
        }
    }
}
