//! The server-side scripts: acquire, renew, release, read and break, one
//! Lua script each, so each operation is one request that the server runs
//! atomically (no other command runs between its reads and its writes).
//!
//! # Keys
//!
//! For the lease key `k` under the prefix `p`: the lease record at
//! `p{k}` (a string with the server's own expiry, `PX`), the fence counter
//! at `p{k}:fence` (a decimal string, never expiring, never deleted by this
//! crate) and the audit records at `p{k}:audit` (a list of JSON records,
//! oldest first). The braces are Redis' hash tag: the three keys share one
//! cluster slot, so a script may touch all of them.
//!
//! # The record
//!
//! `lease-redis/1\n<holder>\n<fence>\n<ttl_ms>\n<payload bytes>`, the
//! numbers in canonical decimal. A value is a lease record when it parses
//! that way, its holder is a holder id, its fence is in
//! 1..=[`MAX_FENCE`], its TTL in the TTL rule's range, its payload at most
//! `MAX_PAYLOAD_LEN` bytes, and its key has an expiry no more than two TTLs
//! away (written as one TTL; the second tolerates a server clock stepped
//! back by up to a TTL). Anything else at the lease key, or a counter that
//! is not such a number, is corrupt: every script but break refuses to
//! write when it finds one, and the caller gets `Error::CorruptRecord`
//! (`corrupt` answers, which a break mends; `refused` ones say what to
//! do).
//! Scripts check everything before their first write, the user's
//! permission for each command they will run included
//! (`redis.acl_check_cmd`): a Redis script that fails halfway keeps the
//! writes it made.
//!
//! # Fences
//!
//! A new grant's fence is `max(counter + 1, server TIME in µs)`, and every
//! script that writes a grant, renews it, releases it or breaks it also
//! raises the counter to that grant's fence. Why the fence of each new
//! grant of a key is strictly above every earlier one:
//!
//! 1. While the counter lives, it is at least every fence granted for the
//!    key: the granting script writes it, the counter only ever grows
//!    (every write is a maximum), and nothing of this crate deletes it.
//!    The new fence is at least counter + 1.
//! 2. When the counter is gone or older than the last grant (an outside
//!    `DEL`, a restart that replayed less than was acknowledged, a restore,
//!    a failover to a replica that lagged), the new fence is at least the
//!    server's clock in microseconds. Every earlier fence `f` was granted by
//!    a script that read the clock at some `t` with `f = max(c + 1, t)`;
//!    by induction `c` was at most the clock when it was granted, so
//!    `f <= t` unless two grants of one key fell within one microsecond —
//!    each grant is a script of its own and runs for several
//!    microseconds, and a grant of a key needs the previous one released
//!    or expired first. The clock has moved on since `t`, so the new fence
//!    is above `f`.
//! 3. The live record keeps its own fence: a counter deleted under a live
//!    grant is written again by that grant's next renewal or its release.
//!
//! Case 2 needs the server's clock never to step back (as every clock
//! authority does). Lua numbers are doubles, exact to 2^53: fences stop at
//! [`MAX_FENCE`], which the clock reaches in the year 2255.

use redis::Cmd;

/// The largest fence: 2^53 − 1, the largest integer a Lua number holds
/// exactly.
pub(crate) const MAX_FENCE: u64 = (1 << 53) - 1;

/// Helpers every script shares.
const PRELUDE: &str = r#"
local MAX_FENCE = 9007199254740991
local MAX_PAYLOAD = 65536
local MIN_TTL = 1000
local MAX_TTL = 86400000
local DEADLINE_TTLS = 2

-- An integer as canonical decimal text (tostring prints 1.7e+15).
local function dec(n)
  return string.format('%.0f', n)
end

-- A canonical decimal in 1..max: its number, else nil.
local function int(s, max)
  if #s > 16 or not string.match(s, '^[1-9]%d*$') then
    return nil
  end
  local n = tonumber(s)
  if n > max then
    return nil
  end
  return n
end

-- The string at k (nil when there is none), or nil and what is there.
local function str(k)
  local t = redis.call('TYPE', k)['ok']
  if t == 'none' then
    return nil, nil
  end
  if t ~= 'string' then
    return nil, 'a ' .. t .. ', not a string'
  end
  return redis.call('GET', k), nil
end

-- The lease record v whose key expires in pttl ms, or nil and what is wrong.
local function parse(v, pttl)
  local holder, fence, ttl, at = string.match(v, '^lease%-redis/1\n([!-~]+)\n(%d+)\n(%d+)\n()')
  if not holder then
    return nil, 'it is not a lease-redis/1 record (format, holder, fence, TTL, payload)'
  end
  if #holder > 128 then
    return nil, 'its holder is longer than 128 bytes'
  end
  local f = int(fence, MAX_FENCE)
  if not f then
    return nil, 'its fence is not a number in 1..=9007199254740991'
  end
  local t = int(ttl, MAX_TTL)
  if not t or t < MIN_TTL then
    return nil, 'its TTL is not a number of milliseconds in 1000..=86400000'
  end
  local payload = string.sub(v, at)
  if #payload > MAX_PAYLOAD then
    return nil, 'its payload is longer than 65536 bytes'
  end
  if pttl < 0 then
    return nil, 'the key has no expiry (a lease record always has one)'
  end
  if pttl > DEADLINE_TTLS * t then
    return nil, 'the key expires more than 2 TTLs from now (a lease record is written to expire after one)'
  end
  return { holder = holder, fence = f, ttl = t, payload = payload, pttl = pttl }
end

-- The counter's value (0: none), or nil and what is wrong with it.
local function count(c)
  if c == nil then
    return 0, nil
  end
  local n = int(c, MAX_FENCE)
  if not n then
    return nil, 'the fence counter is not a number in 1..=9007199254740991'
  end
  return n, nil
end

-- The state of a lease: its record (false: free) and its counter, or
-- nil, nil and what is corrupt.
local function state(lease, counter)
  local v, other = str(lease)
  if other then
    return nil, nil, 'the lease key holds ' .. other
  end
  local c, cother = str(counter)
  if cother then
    return nil, nil, 'the fence counter holds ' .. cother
  end
  local n, wrong = count(c)
  if wrong then
    return nil, nil, wrong
  end
  if not v then
    return false, n, nil
  end
  local rec, why = parse(v, redis.call('PTTL', lease))
  if not rec then
    return nil, nil, 'the lease key: ' .. why
  end
  return rec, n, nil
end

local function record(holder, fence, ttl, payload)
  return 'lease-redis/1\n' .. holder .. '\n' .. dec(fence) .. '\n' .. dec(ttl) .. '\n' .. payload
end

local function holding(tag, rec)
  return { tag, rec.holder, dec(rec.fence), dec(rec.ttl), rec.payload, rec.pttl }
end

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Nil when the user may run every command of cmds (lists of a name and
-- its arguments), else the answer naming the first it may not. Checked
-- before a script's first write: a command the server refuses (ACL: a
-- channel, a key, a command) fails the script there, and the script keeps
-- the writes it made before it.
local function denied(cmds)
  for _, c in ipairs(cmds) do
    if not redis.acl_check_cmd(unpack(c)) then
      return { 'denied', 'the user may not run ' .. c[1] .. ' on ' .. c[2] .. ' (ACL)' }
    end
  end
  return nil
end

-- Keeps the counter at or above fence.
local function raise(counter, n, fence)
  if n < fence then
    redis.call('SET', counter, dec(fence))
  end
end
"#;

/// KEYS: lease, counter. ARGV: holder, ttl_ms, payload, channel, key.
/// Answers the grant with its effective TTL: a re-acquire of a live grant
/// keeps the longer of its TTL and the request's.
const ACQUIRE: &str = r#"
local rec, n, wrong = state(KEYS[1], KEYS[2])
if wrong then
  return { 'corrupt', wrong }
end
local ttl = tonumber(ARGV[2])
local fence
if rec then
  if rec.holder ~= ARGV[1] then
    return holding('held', rec)
  end
  -- Its own live grant, whose answer was lost: the same grant again, and
  -- never shorter. The first answer may have arrived after all (or another
  -- task shares the holder id): that grant counts its deadline, and its
  -- renewals, from the record's TTL.
  fence = rec.fence
  ttl = math.max(ttl, rec.ttl)
else
  fence = math.max(n + 1, now_us())
  if fence > MAX_FENCE then
    return { 'refused', 'the fence counter is at 2^53 - 1, the largest fence there is' }
  end
end
local refusal = denied({ { 'SET', KEYS[1], '' }, { 'SET', KEYS[2], '' }, { 'PUBLISH', ARGV[4], '' } })
if refusal then
  return refusal
end
redis.call('SET', KEYS[1], record(ARGV[1], fence, ttl, ARGV[3]), 'PX', ttl)
raise(KEYS[2], n, fence)
redis.call('PUBLISH', ARGV[4], ARGV[5])
return { 'granted', ARGV[1], dec(fence), dec(ttl), ARGV[3], ttl }
"#;

/// KEYS: lease, counter. ARGV: holder, fence, `1` to replace the payload
/// (else `0`), payload, channel, key.
const RENEW: &str = r#"
local rec, n, wrong = state(KEYS[1], KEYS[2])
if wrong then
  return { 'corrupt', wrong }
end
if not rec or rec.holder ~= ARGV[1] or dec(rec.fence) ~= ARGV[2] then
  return { 'lost' }
end
local refusal = denied({ { 'SET', KEYS[1], '' }, { 'SET', KEYS[2], '' }, { 'PUBLISH', ARGV[5], '' } })
if refusal then
  return refusal
end
local payload = rec.payload
if ARGV[3] == '1' then
  payload = ARGV[4]
end
redis.call('SET', KEYS[1], record(rec.holder, rec.fence, rec.ttl, payload), 'PX', rec.ttl)
raise(KEYS[2], n, rec.fence)
if payload ~= rec.payload then
  redis.call('PUBLISH', ARGV[5], ARGV[6])
end
return { 'renewed' }
"#;

/// KEYS: lease, counter. ARGV: holder, fence, channel, key.
const RELEASE: &str = r#"
local rec, n, wrong = state(KEYS[1], KEYS[2])
if wrong then
  return { 'corrupt', wrong }
end
if not rec or rec.holder ~= ARGV[1] or dec(rec.fence) ~= ARGV[2] then
  return { 'other' }
end
local refusal = denied({ { 'DEL', KEYS[1] }, { 'SET', KEYS[2], '' }, { 'PUBLISH', ARGV[3], '' } })
if refusal then
  return refusal
end
redis.call('DEL', KEYS[1])
raise(KEYS[2], n, rec.fence)
redis.call('PUBLISH', ARGV[3], ARGV[4])
return { 'released' }
"#;

/// KEYS: lease, counter. Declared `no-writes`: the server refuses any
/// write it might attempt.
const READ: &str = r#"
local rec, n, wrong = state(KEYS[1], KEYS[2])
if wrong then
  return { 'corrupt', wrong }
end
if not rec then
  return { 'free' }
end
return holding('held', rec)
"#;

/// KEYS: lease, counter, audit. ARGV: channel, key, the audit record's
/// first fields as JSON object members (format, action, key, by, reason,
/// at_unix_ms).
const BREAK: &str = r#"
local B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'
local function b64(s)
  local out = {}
  for i = 1, #s, 3 do
    local a, b, c = string.byte(s, i, i + 2)
    local v = a * 65536 + (b or 0) * 256 + (c or 0)
    local d1 = math.floor(v / 262144) % 64 + 1
    local d2 = math.floor(v / 4096) % 64 + 1
    local d3 = math.floor(v / 64) % 64 + 1
    local d4 = v % 64 + 1
    out[#out + 1] = string.sub(B64, d1, d1) .. string.sub(B64, d2, d2)
      .. (b and string.sub(B64, d3, d3) or '=') .. (c and string.sub(B64, d4, d4) or '=')
  end
  return table.concat(out)
end

local lease, counter, audit = KEYS[1], KEYS[2], KEYS[3]
local kind = redis.call('TYPE', audit)['ok']
if kind ~= 'none' and kind ~= 'list' then
  return { 'refused', 'the audit key holds a ' .. kind .. ', not a list; move it away: a break appends its record there' }
end
local previous, removed = nil, nil
local v, other = str(lease)
if other then
  removed = redis.call('DUMP', lease)
elseif v then
  local rec = parse(v, redis.call('PTTL', lease))
  if rec then
    previous = rec
  else
    removed = v
  end
end
local c, cother = str(counter)
local n, cwrong = 0, nil
if cother then
  cwrong = true
  removed = removed or redis.call('DUMP', counter)
else
  local m, wrong = count(c)
  if wrong then
    cwrong = true
    removed = removed or c
  else
    n = m
  end
end
-- The counter from now on: above every fence granted for the key. A
-- corrupt value hides which fences it stood for; the server's clock in
-- microseconds is above them (see the fence rules).
local floor = n
if previous and previous.fence > floor then
  floor = previous.fence
end
if removed then
  floor = math.max(floor, now_us())
end
local refusal = denied({ { 'DEL', lease }, { 'SET', counter, '' }, { 'LLEN', audit },
  { 'RPUSH', audit, '' }, { 'PUBLISH', ARGV[1], '' } })
if refusal then
  return refusal
end
redis.call('DEL', lease)
if floor > 0 and (floor ~= n or cwrong) then
  redis.call('SET', counter, dec(floor))
end
local seq = redis.call('LLEN', audit) + 1
local prev = 'null'
if previous then
  prev = '{"holder":' .. cjson.encode(previous.holder) .. ',"fence":' .. dec(previous.fence)
    .. ',"ttl_ms":' .. dec(previous.ttl) .. ',"payload_len":' .. dec(#previous.payload) .. '}'
end
local rem = 'null'
if removed then
  rem = '{"len":' .. dec(#removed) .. ',"head_base64":"' .. b64(string.sub(removed, 1, 4096)) .. '"}'
end
redis.call('RPUSH', audit, '{' .. ARGV[3] .. ',"seq":' .. dec(seq) .. ',"previous":' .. prev
  .. ',"removed_corrupt_record":' .. tostring(removed ~= nil) .. ',"removed":' .. rem .. '}')
redis.call('PUBLISH', ARGV[1], ARGV[2])
if previous then
  return { 'broken', dec(seq), previous.holder, dec(previous.fence), dec(previous.ttl),
    previous.payload, previous.pttl }
end
return { 'broken', dec(seq) }
"#;

/// One script: its source and its SHA-1, by which `EVALSHA` names it.
#[derive(Debug)]
pub(crate) struct Script {
    /// The operation, for errors.
    pub(crate) name: &'static str,
    /// Whether running it twice is harmless (see `Client::run`).
    pub(crate) retry: bool,
    body: String,
    hash: String,
}

impl Script {
    fn new(name: &'static str, flags: &str, body: &str) -> Script {
        // Every operation is safe to run twice but a break, which would end
        // whatever grant came after its first run.
        let retry = name != "break";
        // The shebang makes it a Redis 7 script: with no `allow-oom` flag
        // the server refuses to start it when out of memory, rather than
        // failing a write halfway.
        let body = format!("#!lua{flags}\n{PRELUDE}\n{body}");
        let hash = redis::Script::new(&body).get_hash().to_owned();
        Script {
            name,
            retry,
            body,
            hash,
        }
    }

    /// `EVALSHA hash …`, or `EVAL body …` (`by_hash` false).
    pub(crate) fn invocation(&self, by_hash: bool, keys: &[&[u8]], args: &[&[u8]]) -> Cmd {
        let mut cmd = if by_hash {
            let mut c = redis::cmd("EVALSHA");
            c.arg(&self.hash);
            c
        } else {
            let mut c = redis::cmd("EVAL");
            c.arg(&self.body);
            c
        };
        cmd.arg(keys.len());
        for k in keys {
            cmd.arg(*k);
        }
        for a in args {
            cmd.arg(*a);
        }
        cmd
    }
}

/// The five scripts.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) acquire: Script,
    pub(crate) renew: Script,
    pub(crate) release: Script,
    pub(crate) read: Script,
    pub(crate) break_lease: Script,
}

impl Scripts {
    pub(crate) fn new() -> Scripts {
        Scripts {
            acquire: Script::new("acquire", "", ACQUIRE),
            renew: Script::new("renew", "", RENEW),
            release: Script::new("release", "", RELEASE),
            read: Script::new("read", " flags=no-writes", READ),
            break_lease: Script::new("break", "", BREAK),
        }
    }
}
