-- Replaces a worker's full sparse runtime report, fenced by sequence.
-- KEYS: session, runtime, epoch
-- ARGV: session_id, sequence, snapshot_version, ownership_epoch, digest, body, session_ttl_ms, report_ttl_ms
local s = redis.call('HMGET', KEYS[1], 'sid', 'acked_v', 'acked_e')
if s[1] ~= ARGV[1] then
  return {'STALE_SESSION', 0}
end
if s[2] == '0' then
  return {'NOT_ACKNOWLEDGED', 0}
end
if s[2] ~= ARGV[3] or s[3] ~= ARGV[4] then
  return {'SNAPSHOT_MISMATCH', 0}
end
local r = redis.call('HMGET', KEYS[2], 'seq', 'digest')
if r[1] then
  local stored, seq = tonumber(r[1]), tonumber(ARGV[2])
  if seq < stored then
    return {'STALE_REPORT', 0}
  end
  if seq == stored and r[2] ~= ARGV[5] then
    return {'CONFLICTING_REPORT', 0}
  end
end
local epoch = tonumber(redis.call('GET', KEYS[3]) or '1')
local t = redis.call('TIME')
redis.call('HSET', KEYS[2], 'sid', ARGV[1], 'seq', ARGV[2], 'digest', ARGV[5], 'body', ARGV[6],
  'received_ms', t[1] * 1000 + math.floor(t[2] / 1000))
redis.call('PEXPIRE', KEYS[2], ARGV[8])
redis.call('PEXPIRE', KEYS[1], ARGV[7])
return {'OK', epoch}
