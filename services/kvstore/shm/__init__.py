"""Same-host shared memory: a kvstore's host pools in memfd segments that other processes of the same user map."""
