"""The OpenAI-compatible server over the engine: routes, request models, responses, the engine thread."""
