"""The Anthropic Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) as a front end of
the chat pipeline: `protocol.py` parses the request and translates it into a chat request,
`messages.py` translates the chat reply (body or chunks) back, `serving.py` serves both over HTTP."""
