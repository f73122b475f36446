"""From the lesson to a server: the production checklist (greedy, speculation off and on, a token diff and
the timings, as a report) and our settings in the serving engines' own configuration keys.

Pure logic on top of the decoder; the Road to production page and the walkthrough draw it.
"""
