-- first_seen.lua: when a worker first saw a message it could not take (an unknown task,
-- during a rolling deploy); the worker hands it back until a grace period after that.
-- Kept in the message's record as field 'u', which no other script reads: a record with
-- only 'u' reads as "never seen" everywhere else.
--
-- KEYS[1]  the message's record (KEYS[2]: its old key; record.lua, prepended, sets `key`)
-- ARGV[1]  now_ms
-- ARGV[2]  keep_ms            how long to keep the mark if the record has no TTL yet
--
-- Returns the first time, in ms.

local now = tonumber(ARGV[1])
redis.call('HSETNX', key, 'u', now)
if redis.call('PTTL', key) < 0 then
  redis.call('PEXPIRE', key, tonumber(ARGV[2]))
end
return tonumber(redis.call('HGET', key, 'u'))
