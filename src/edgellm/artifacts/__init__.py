"""Model artifacts (manifests, tokenizers, weight shards) served from R2 under `/models/`."""

from .routes import get_artifact, list_published_models

__all__ = ["get_artifact", "list_published_models"]
