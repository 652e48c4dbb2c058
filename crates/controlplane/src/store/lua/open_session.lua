-- Replaces a worker's session and clears what belonged to the old one.
-- KEYS: session, runtime, issued, epoch
-- ARGV: session_id, instance_id, zone, labels_json, ttl_ms
local epoch = tonumber(redis.call('GET', KEYS[4]) or '0')
if epoch < 1 then
  epoch = 1
  redis.call('SET', KEYS[4], epoch)
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('HSET', KEYS[1], 'sid', ARGV[1], 'instance', ARGV[2], 'zone', ARGV[3], 'labels', ARGV[4],
  'acked_v', '0', 'acked_e', '0', 'nacked_v', '0')
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {'OK', epoch}
