-- replay.lua: may this dead letter be replayed? The same rules as
-- celery_beetle.store.outcome.decide_replay, in one atomic step. Not prepended with record.lua:
-- it reads the record under both keys itself, and deletes both when it resets it.
--
-- KEYS[1]  the message's replay mark (celery_beetle.store.keys.replay_mark_key):
--          r:<replay id>:<expires at ms> or p:..., or r:<replay id> as older versions wrote
-- KEYS[2]  the message's record; KEYS[3] optional: its old key (celery_beetle.store.keys)
-- ARGV[1]  replay_id: names the dead letter
-- ARGV[2]  mark_ttl_ms: how long the mark is kept (outcome.replay_mark_ttl_ms)
-- ARGV[3]  now_ms
-- ARGV[4]  window_end_ms: the dead letter's message's expiry (0: unknown)
-- ARGV[5]  expires_at_ms: the expiry of the copy this replay publishes, kept in the mark
-- ARGV[6]  force: '1' runs what cannot be proven not to have completed
--
-- Returns {'run', expires_at_ms} (record deleted, mark r:<id>:<expires_at_ms> written),
-- {'republish', expires at ms in the mark (0: unknown)}, {'done'}, {'completed'},
-- {'in_flight'} or {'refused'}.

local id = ARGV[1]
local now = tonumber(ARGV[3])
local window_end = tonumber(ARGV[4])
local force = ARGV[6] == '1'

local mark = redis.call('GET', KEYS[1])
local published, marked_id, marked_until = false, nil, 0
if mark and (string.sub(mark, 1, 2) == 'r:' or string.sub(mark, 1, 2) == 'p:') then
  published = string.sub(mark, 1, 2) == 'p:'
  local rest = string.sub(mark, 3)
  local sep = string.find(rest, ':', 1, true)
  if sep then
    marked_id = string.sub(rest, 1, sep - 1)
    marked_until = tonumber(string.sub(rest, sep + 1)) or 0
  else
    marked_id = rest
  end
end

local fields = redis.call('HMGET', KEYS[2], 's', 'w')
if not fields[1] and KEYS[3] then
  fields = redis.call('HMGET', KEYS[3], 's', 'w')
end
local status, owed = fields[1], fields[2]

if marked_id == id then
  if published then
    return {'done'}
  end
  if status or now < marked_until or force then
    return {'republish', marked_until}
  end
  return {'refused'}
end
if status == 'c' then
  return {'completed'}
end
if status and (status ~= 'f' or owed) then
  return {'in_flight'}
end
if not status then
  if marked_id and now < marked_until then
    return {'in_flight'}
  end
  if not force and (marked_id or now >= window_end) then
    return {'refused'}
  end
end

redis.call('DEL', KEYS[2])
if KEYS[3] then
  redis.call('DEL', KEYS[3])
end
redis.call('SET', KEYS[1], 'r:' .. id .. ':' .. ARGV[5], 'PX', tonumber(ARGV[2]))
return {'run', tonumber(ARGV[5])}
