-- claim.lua: grant the lease on a message to one worker, or say why not.
-- The same rules as celery_beetle.store.outcome.decide_claim, in one atomic step.
--
-- KEYS[1]  the message's record (KEYS[2]: its old key; record.lua, prepended, sets `key`)
-- ARGV[1]  now_ms             the caller's clock (never Redis TIME, so tests need no sleep)
-- ARGV[2]  expires_at_ms      the message's expiry (x-beetle-expires-at)
-- ARGV[3]  lease_timeout_ms
-- ARGV[4]  attempts_limit     the most times the body may start
-- ARGV[5]  owner              who claims (one run's own id), at most 48 bytes
-- ARGV[6]  ttl_margin_ms      kept past the message's expiry, lease and retry time
-- ARGV[7]  dead_letter_lease_ms  how long the owner of a give-up has to publish its dead letter
-- ARGV[8]  reserve_ms         >0: the gate's claim, a reservation of this length that counts
--                             no attempt (start.lua counts it when the body begins); 0 or
--                             absent: a start, counted now, with the full lease
-- ARGV[9]  inbox_extra_starts more starts allowed after a crash of a body that marked the
--                             inbox (field i): it finds its row on the next run
--
-- Returns one of
--   {'acquired', token, attempt, lease_deadline_ms, taken_over}   also to the same owner
--                                          asking again (a lost reply): same token and
--                                          attempt; taken_over 1 when a body that began
--                                          under another owner's lease was cut short (its
--                                          worker died or it outlived the lease), else 0.
--                                          For a reservation, attempt is the one its start
--                                          will count
--   {'done', status}                       status 'c' completed or 'f' failed (and dead-lettered)
--   {'locked', lease_deadline_ms, owner}   another owner's lease is live (a run, or a dead
--                                          letter being published)
--   {'delayed', retry_not_before_ms}
--   {'dead_letter', reason, attempts, exceptions}   the message will not run: publish its
--                                          dead letter, then dead_lettered.lua
--   {'expired'}

local now = tonumber(ARGV[1])
local expires_at = tonumber(ARGV[2])
local lease_timeout = tonumber(ARGV[3])
local attempts_limit = tonumber(ARGV[4])
local owner = ARGV[5]
local margin = tonumber(ARGV[6])
local dead_letter_lease = tonumber(ARGV[7])
local reserve = tonumber(ARGV[8]) or 0
local inbox_extra = tonumber(ARGV[9]) or 0

if expires_at <= now then
  return {'expired'}
end

local fields = redis.call('HMGET', key, 's', 'a', 'l', 'n', 'o', 't', 'x', 'w', 'r', 'e', 'v', 'i')
local status = fields[1]
local attempts = tonumber(fields[2]) or 0
local lease = tonumber(fields[3]) or 0
local not_before = tonumber(fields[4]) or 0
local holder = fields[5] or ''
local token = tonumber(fields[6]) or 0
local stored_expiry = tonumber(fields[7]) or 0
local owed = fields[8]
local exceptions = tonumber(fields[10]) or 0
local reserved = fields[11]
local inbox = fields[12]

local function owe_dead_letter(reason)
  local deadline = now + dead_letter_lease
  redis.call('HSET', key, 's', 'f', 'w', 1, 'r', reason, 'o', owner, 'l', deadline)
  redis.call('HDEL', key, 'n', 'v', 'i')
  redis.call('PEXPIRE', key, math.max(stored_expiry, deadline) - now + margin)
  return {'dead_letter', reason, attempts, exceptions}
end

if status == 'c' or (status == 'f' and not owed) then
  return {'done', status}
end
if status == 'r' and owner ~= '' and holder == owner then
  local attempt = attempts
  local deadline = now + lease_timeout
  if reserved and reserve > 0 then
    deadline = now + reserve
    attempt = attempts + 1
  elseif reserved then  -- a start over its own reservation: the attempt counts now
    attempts = attempts + 1
    attempt = attempts
    redis.call('HSET', key, 'a', attempts)
    redis.call('HDEL', key, 'v')
  end
  redis.call('HSET', key, 'l', deadline)
  redis.call('PEXPIRE', key, math.max(stored_expiry, deadline) - now + margin)
  return {'acquired', token, attempt, deadline, 0}
end
if status == 'f' then
  if lease > now and holder ~= owner then
    return {'locked', lease, holder}
  end
  return owe_dead_letter(fields[9] or '')
end
if status == 'r' and lease > now then
  return {'locked', lease, holder}
end
if status == 'p' and not_before > now then
  return {'delayed', not_before}
end
local limit = attempts_limit
if inbox and status == 'r' then
  limit = attempts_limit + inbox_extra
end
if status and attempts >= limit then
  return owe_dead_letter('attempts_limit')
end

local taken_over = (status == 'r' and not reserved) and 1 or 0
-- the later of the copies' expiries: a replay's fresh copy may meet an older twin
expires_at = math.max(expires_at, stored_expiry)
if reserve > 0 then
  local deadline = now + reserve
  redis.call('HSET', key, 's', 'r', 'a', attempts, 'l', deadline, 'o', owner,
    't', token + 1, 'x', expires_at, 'v', 1)
  redis.call('HDEL', key, 'n')
  redis.call('PEXPIRE', key, math.max(expires_at, deadline) - now + margin)
  return {'acquired', token + 1, attempts + 1, deadline, taken_over}
end
local deadline = now + lease_timeout
redis.call('HSET', key, 's', 'r', 'a', attempts + 1, 'l', deadline, 'o', owner,
  't', token + 1, 'x', expires_at)
redis.call('HDEL', key, 'n', 'v')
redis.call('PEXPIRE', key, math.max(expires_at, deadline) - now + margin)
return {'acquired', token + 1, attempts + 1, deadline, taken_over}
