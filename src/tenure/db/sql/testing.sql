-- Statements of tenure.testing (the pytest plugin's helpers). Never run by tenure itself.

-- name: testing_expire_lease
-- The live lease on job_key expires now, by the database clock, as if its holder had stopped
-- renewing a TTL ago. Its token stays the newest issued until a successor acquires.
UPDATE {schema}.job_leases
SET lease_until = clock_timestamp() - interval '1 millisecond'
WHERE job_key = %(job_key)s AND lease_until >= clock_timestamp()
RETURNING fencing_token
