"""How it works: the rule in plain words, the colours, and the lesson's workloads with a button to try each."""
import pandas as pd
import streamlit as st

from app import sidebar, view

st.title("How speculative decoding works")
st.markdown("""
A language model writes one token at a time, and each token costs one **forward pass** of the whole model.
On a GPU that pass is slow mostly because the weights must be read from memory, not because of the
arithmetic, so checking several tokens in one pass costs about the same as making one.

Speculative decoding uses that spare capacity:

1. **Draft.** A cheap drafter guesses the next *k* tokens: a small model, or text copied from the prompt.
2. **Verify.** The big target model scores all *k* guesses in **one** forward pass. Guess *x* is kept with
   probability **min(1, p(x) / q(x))**, where *p* is the target's probability and *q* the drafter's. A random
   number *u* decides: keep if *u* < min(1, p/q). The first rejected guess and everything after it is dropped.
3. **Correct.** After a rejection, one token is drawn from **norm(max(0, p − q))**, the part of the target's
   distribution the drafter under-covered. If every guess passed, the same pass gives one **bonus** token.

Every step therefore commits at least one token, and up to *k* + 1. The rule is exact: the text comes out
with exactly the probabilities the target alone would give it (Leviathan et al. 2023; Chen et al. 2023).
A bad drafter makes it slower, never wrong.
""")
st.markdown("#### The colours")
st.html(view.legend())

st.markdown("#### When it helps")
st.markdown("The lesson's workloads, with the benefit it expects. Try one: the button loads a prompt and its "
            "usual temperature into the sidebar; then open **Step by step** or **Race**.")
st.table(pd.DataFrame([{"Workload": w.label, "Expected benefit": w.expected, "Why": w.why,
                        "Usual temperature": f"{w.temperature:g}"} for w in sidebar.WORKLOADS.values()])
         .set_index("Workload"))
for col, (name, w) in zip(st.columns(len(sidebar.PRESETS)), sidebar.PRESETS.items()):
    col.button(f"Try: {name}", key=f"try_{name}", on_click=sidebar.load_preset, args=(name, 0),
               width="stretch", help=w.label)
