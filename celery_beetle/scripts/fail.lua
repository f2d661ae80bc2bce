-- fail.lua: count the body's exception; retry after a backoff, or give up.
-- The same rules as celery_beetle.outcome.decide_failure, in one atomic step.
--
-- KEYS[1]  the message's record, beetle:{<queue>:<message_id>}
-- ARGV[1]  token              the fencing token the claim returned
-- ARGV[2]  now_ms
-- ARGV[3]  attempts_limit
-- ARGV[4]  exceptions_limit   the most exceptions tolerated (beetle: more gives up)
-- ARGV[5]  retryable          1 if the exception is one of the task's retry_on, else 0
-- ARGV[6]  delay_ms           wait after the first failure; doubles per failure
-- ARGV[7]  max_delay_ms       cap on the wait
-- ARGV[8]  ttl_margin_ms
--
-- Returns one of
--   {'retry', delay_ms, retry_not_before_ms, attempts, exceptions}   record pending
--   {'give_up', reason, attempts, exceptions}                        record failed;
--       reason 'not_retryable', 'attempts_limit' or 'exceptions_limit' (first that applies)
--   {'not_owner'}                           not running under this token

local key = KEYS[1]
local token = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
local attempts_limit = tonumber(ARGV[3])
local exceptions_limit = tonumber(ARGV[4])
local retryable = ARGV[5] == '1'
local delay_ms = tonumber(ARGV[6])
local max_delay_ms = tonumber(ARGV[7])
local margin = tonumber(ARGV[8])

local fields = redis.call('HMGET', key, 's', 'a', 'e', 't', 'x')
if fields[1] ~= 'r' or (tonumber(fields[4]) or 0) ~= token then
  return {'not_owner'}
end
local attempts = tonumber(fields[2]) or 0
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
  redis.call('HSET', key, 's', 'f', 'e', exceptions)
  redis.call('HDEL', key, 'l', 'n', 'o')
  redis.call('PEXPIRE', key, math.max(expires_at - now, 0) + margin)
  return {'give_up', reason, attempts, exceptions}
end

-- celery_beetle.backoff.backoff_ms: delay * 2^(n-1), capped; the exponent is bounded there too.
local delay = 0
if delay_ms > 0 then
  delay = math.max(math.min(delay_ms * 2 ^ math.min(exceptions - 1, 62), max_delay_ms), 0)
end
local not_before = now + delay
redis.call('HSET', key, 's', 'p', 'e', exceptions, 'n', not_before)
redis.call('HDEL', key, 'l', 'o')
redis.call('PEXPIRE', key, math.max(expires_at, not_before) - now + margin)
return {'retry', delay, not_before, attempts, exceptions}
