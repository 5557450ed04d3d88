"""The Cloudflare platform on the local edge: KV, R2, Durable Objects, the edge cache, static
assets, request isolation as workerd enforces it, and the HTTP server in front."""
