"""Where a generation runs: the edge (the AI binding) or an origin (any OpenAI-compatible URL).

`config` parses the policy from `[vars]`, `breaker` and `state` are plain per-isolate data,
`origin` is the OpenAI client over the `HTTPFetch` port, `counting` counts prompt tokens with
the pure-Python `edgellm.tokenizer`, `plan` decides where a request goes
first and `failover` runs that plan, failing over to an origin. A pool of replicas is ordered per
request by `scheduler` (pure: the cost, the load bound) over a `fleet.PoolView` (in flight, held
prefixes, reported load, a breaker per replica), which `pools` keeps per isolate, `probe` refreshes
from the replicas' `/metrics`, and `router` keeps for the whole pool in a Durable Object. Importing this package imports nothing else
(the state dataclasses are imported by `edgellm.state`).
"""
