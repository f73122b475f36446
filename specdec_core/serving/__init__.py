"""From the lesson to a server: the production checklist (greedy, speculation off and on, a token diff and
the timings, as a report), our settings in the serving engines' own configuration keys, the same checklist
against a live OpenAI-compatible server (endpoint.py, remote.py), and llama.cpp measured beside our engine on
the same model file (peer.py).

Pure logic on top of the decoder; the Road to production page, the walkthrough and the command line draw it.
"""
