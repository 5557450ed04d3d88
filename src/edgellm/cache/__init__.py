"""The deterministic response cache in Workers KV.

`key` builds the canonical cache key, `policy` reads the request's cache controls, `entry`
(de)serialises answers, `flight` coalesces identical in-flight generations, and `service`
ties them together for the API handlers and the admin routes.
"""
