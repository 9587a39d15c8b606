"""The OpenAI Responses API (`POST /v1/responses`), stateless, as a front end of the chat pipeline:
`protocol.py` parses the request and translates it into a chat request, `output.py` translates the chat
reply (body or chunks) back into a response object or its stream events, `serving.py` serves them."""
