-- The questions an ops dashboard asks of the receipts database, one query each.
-- Every query runs unchanged on SQLite and PostgreSQL (tests/test_views.py runs them all on both): the views
-- of migrations 0002 and 0010 compute ages (age_seconds), UTC days ('YYYY-MM-DD') and days_ago per dialect.
-- `agent` is the name an agent gave with proxy authentication (config `agents:`), null for an anonymous one.
-- "Unknown" means the outcome is not known yet: outcome_unknown, reconciling or manual_review.
-- Each question is the comment line just above its query.

-- Which unknown receipts are older than ten minutes?
SELECT operation_id, state, host, operation, method, path, created_at, error_code, age_seconds
FROM v_open_receipts
WHERE state IN ('outcome_unknown', 'reconciling', 'manual_review') AND age_seconds > 600
ORDER BY age_seconds DESC;

-- How many unknowns does each host have, and how old is its oldest?
SELECT host, unknown_count, manual_review_count, oldest_age_seconds
FROM v_unknowns_by_host
ORDER BY unknown_count DESC, oldest_age_seconds DESC;

-- How many receipts are open, by age bucket?
SELECT CASE
         WHEN age_seconds < 60 THEN '1: under 1 minute'
         WHEN age_seconds < 600 THEN '2: 1 to 10 minutes'
         WHEN age_seconds < 3600 THEN '3: 10 to 60 minutes'
         WHEN age_seconds < 86400 THEN '4: 1 to 24 hours'
         ELSE '5: over a day'
       END AS age_bucket,
       COUNT(*) AS open_receipts,
       MIN(age_seconds) AS youngest_seconds,
       MAX(age_seconds) AS oldest_seconds
FROM v_open_receipts
GROUP BY 1
ORDER BY 1;

-- How many receipts were created each day of the last 7 days, by state and host?
SELECT day, host, state, receipt_count
FROM v_daily_counts
WHERE days_ago < 7
ORDER BY day DESC, host, state;

-- How many duplicates were refused (or replayed) each day, and which receipt blocked them?
SELECT day, reason, blocking_operation_id, blocking_operation, blocking_state, COUNT(*) AS refused,
       MAX(refused_at) AS last_refused_at
FROM v_duplicates_refused
WHERE days_ago < 7
GROUP BY day, reason, blocking_operation_id, blocking_operation, blocking_state
ORDER BY day DESC, refused DESC, blocking_operation_id;

-- What is in the manual_review queue, oldest first?
SELECT operation_id, host, operation, method, path, created_at, error_code, error_message, age_seconds
FROM v_open_receipts
WHERE state = 'manual_review'
ORDER BY age_seconds DESC;

-- What is the success rate of each operation, among receipts whose outcome is settled?
SELECT operation,
       COUNT(*) AS settled,
       SUM(CASE WHEN state = 'succeeded' THEN 1 ELSE 0 END) AS succeeded,
       SUM(CASE WHEN state = 'rejected' THEN 1 ELSE 0 END) AS rejected,
       SUM(CASE WHEN state = 'safe_to_retry' THEN 1 ELSE 0 END) AS safe_to_retry,
       ROUND(100.0 * SUM(CASE WHEN state = 'succeeded' THEN 1 ELSE 0 END) / COUNT(*), 1) AS success_percent
FROM receipts
WHERE state IN ('succeeded', 'rejected', 'safe_to_retry')
GROUP BY operation
ORDER BY settled DESC, operation;

-- What did each agent write in the last 24 hours, by operation and state?
SELECT COALESCE(agent, 'anonymous') AS agent, operation, state, COUNT(*) AS receipts,
       MIN(created_at) AS first_at, MAX(created_at) AS last_at
FROM v_agent_activity
WHERE age_seconds < 86400
GROUP BY COALESCE(agent, 'anonymous'), operation, state
ORDER BY agent, operation, state;
