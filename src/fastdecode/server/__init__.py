"""`fastdecode serve`: an OpenAI-compatible HTTP server on the continuous-batching engine.

settings.py  the command's keys        protocol.py   request/response shapes (pydantic)
cli.py       socket, lifecycle, drain  app.py        routes, API key, CORS, error handlers
serving.py   the generation endpoints  prepare.py    request -> prompt ids, sampling, stopping
engine_client.py  submit and read outputs (the only path to the engine)
outputs.py   per-choice text and logprobs  metrics.py  Prometheus  accesslog.py  a line per request
errors.py    OpenAI's error shape      state.py      what the handlers share
"""
