"""The OpenAI-compatible server and the endpoint client, against real and scripted servers."""
