-- replay.lua: may this dead letter be replayed? The same rules as
-- celery_beetle.outcome.decide_replay, in one atomic step. Not prepended with record.lua:
-- it reads the record under both keys itself, and deletes both when it resets it.
--
-- KEYS[1]  the message's replay mark (celery_beetle.keys.replay_mark_key)
-- KEYS[2]  the message's record; KEYS[3] optional: its old key (celery_beetle.keys)
-- ARGV[1]  replay_id: names the dead letter
-- ARGV[2]  mark_ttl_ms: how long the mark is kept
--
-- Returns {'run'} (record deleted, mark r:<id> written), {'republish'}, {'done'},
-- {'completed'} or {'in_flight'}.

local mark = redis.call('GET', KEYS[1])
local id = ARGV[1]
if mark == 'p:' .. id then
  return {'done'}
end
if mark == 'r:' .. id then
  return {'republish'}
end

local fields = redis.call('HMGET', KEYS[2], 's', 'w')
if not fields[1] and KEYS[3] then
  fields = redis.call('HMGET', KEYS[3], 's', 'w')
end
local status, owed = fields[1], fields[2]
if status == 'c' then
  return {'completed'}
end
if status and (status ~= 'f' or owed) then
  return {'in_flight'}
end

redis.call('DEL', KEYS[2])
if KEYS[3] then
  redis.call('DEL', KEYS[3])
end
redis.call('SET', KEYS[1], 'r:' .. id, 'PX', tonumber(ARGV[2]))
return {'run'}
