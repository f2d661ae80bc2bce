-- fail.lua: count the body's exception; retry after a backoff, or give up.
-- The same rules as celery_beetle.store.outcome.decide_failure, in one atomic step.
--
-- KEYS[1]  the message's record (KEYS[2]: its old key; record.lua, prepended, sets `key`)
-- ARGV[1]  token              the fencing token the claim returned
-- ARGV[2]  now_ms
-- ARGV[3]  attempts_limit
-- ARGV[4]  exceptions_limit   the most exceptions tolerated (beetle: more gives up)
-- ARGV[5]  retryable          1 if the exception is one of the task's retry_on, else 0
-- ARGV[6]  delay_ms           wait after the first failure; doubles per failure
-- ARGV[7]  max_delay_ms       cap on the wait
-- ARGV[8]  ttl_margin_ms
-- ARGV[9]  owner              the run that failed: it owes the dead letter of a give-up
-- ARGV[10] dead_letter_lease_ms
--
-- Returns one of
--   {'retry', delay_ms, retry_not_before_ms, attempts, exceptions}   record pending
--   {'give_up', reason, attempts, exceptions}                        record failed, its
--       dead letter owed by owner; reason 'not_retryable', 'attempts_limit' or
--       'exceptions_limit' (first that applies)
--   {'not_owner'}                           not running under this token
-- The same failure reported again (a lost reply) gets the same answer and writes nothing.

local token = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
local attempts_limit = tonumber(ARGV[3])
local exceptions_limit = tonumber(ARGV[4])
local retryable = ARGV[5] == '1'
local delay_ms = tonumber(ARGV[6])
local max_delay_ms = tonumber(ARGV[7])
local margin = tonumber(ARGV[8])
local owner = ARGV[9]
local dead_letter_lease = tonumber(ARGV[10])

local fields = redis.call('HMGET', key, 's', 'a', 'e', 't', 'x', 'n', 'w', 'o', 'r')
local stored_token = tonumber(fields[4]) or 0
local attempts = tonumber(fields[2]) or 0
if fields[1] and stored_token == token then  -- recorded already? (a retry after a lost reply)
  if fields[1] == 'p' then
    local not_before = tonumber(fields[6]) or 0
    return {'retry', math.max(not_before - now, 0), not_before, attempts, tonumber(fields[3]) or 0}
  end
  local given_up = fields[9] == 'not_retryable' or fields[9] == 'attempts_limit'
    or fields[9] == 'exceptions_limit'
  if fields[1] == 'f' and fields[7] and fields[8] == owner and given_up then
    return {'give_up', fields[9] or '', attempts, tonumber(fields[3]) or 0}
  end
end
if fields[1] ~= 'r' or stored_token ~= token then
  return {'not_owner'}
end
local exceptions = (tonumber(fields[3]) or 0) + 1
local expires_at = tonumber(fields[5]) or 0

local reason = false
if not retryable then
  reason = 'not_retryable'
elseif attempts >= attempts_limit then
  reason = 'attempts_limit'
elseif exceptions > exceptions_limit then
  reason = 'exceptions_limit'
end
if reason then
  local deadline = now + dead_letter_lease
  redis.call('HSET', key, 's', 'f', 'e', exceptions, 'w', 1, 'r', reason, 'o', owner,
    'l', deadline)
  redis.call('HDEL', key, 'n', 'v', 'i')
  redis.call('PEXPIRE', key, math.max(expires_at, deadline) - now + margin)
  return {'give_up', reason, attempts, exceptions}
end

-- celery_beetle.store.backoff.backoff_ms: delay * 2^(n-1), capped; the exponent is bounded there too.
local delay = 0
if delay_ms > 0 then
  delay = math.max(math.min(delay_ms * 2 ^ math.min(exceptions - 1, 62), max_delay_ms), 0)
end
local not_before = now + delay
redis.call('HSET', key, 's', 'p', 'e', exceptions, 'n', not_before)
redis.call('HDEL', key, 'l', 'o', 'v', 'i')
redis.call('PEXPIRE', key, math.max(expires_at, not_before) - now + margin)
return {'retry', delay, not_before, attempts, exceptions}
