"""`edgellm publish` and `edgellm pull`: a GGUF into artifacts an edge serves, and back, verified."""
