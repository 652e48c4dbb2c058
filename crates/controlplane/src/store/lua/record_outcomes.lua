-- Adds a batch of outcomes to per-proxy totals once per (worker, session, batch).
-- KEYS: session, batch_marker, totals (hash of 'proxy|kind' -> count)
-- ARGV: session_id, session_ttl_ms, dedup_ttl_ms, then triples proxy_id, kind, count
if redis.call('HGET', KEYS[1], 'sid') ~= ARGV[1] then
  return {'STALE_SESSION', 0}
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[3]) then
  return {'DUPLICATE', 0}
end
for n = 4, #ARGV, 3 do
  redis.call('HINCRBY', KEYS[3], ARGV[n] .. '|' .. ARGV[n + 1], ARGV[n + 2])
end
return {'OK', 1}
