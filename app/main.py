"""specdec: watch speculative decoding work, one verification step at a time.

Entry point (`make run`): page config, the shared sidebar, and st.navigation over the pages (app/nav.py).
The guided walkthrough is the default page, served at the root address: it is what a newcomer sees first.
Leviathan et al., "Fast Inference from Transformers via Speculative Decoding" (ICML 2023);
Chen et al., "Accelerating Large Language Model Decoding with Speculative Sampling" (2023).
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run app/main.py` puts app/ on the path, not the project
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from app import classroom, nav, runs, sidebar, view  # noqa: E402

st.set_page_config(page_title="specdec: speculative decoding, step by step", page_icon="⚡", layout="wide")
st.html(view.CSS)

page = nav.navigation()
runs.settle()
classroom.load()
sidebar.build()
classroom.build()
page.run()
