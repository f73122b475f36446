"""specdec: watch speculative decoding work, one verification step at a time.

Entry point (`make run`): page config, the shared sidebar, and st.navigation over the pages in pages/.
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

from app import classroom, runs, sidebar, view  # noqa: E402

st.set_page_config(page_title="specdec: speculative decoding, step by step", page_icon=":material/bolt:", layout="wide")
st.html(view.CSS)

nav = st.navigation({"": [
    st.Page(ROOT / "pages" / "walkthrough.py", title="Start here: guided walkthrough", icon=":material/flag:", default=True),
    st.Page(ROOT / "pages" / "step.py", title="Step by step", icon=":material/slow_motion_video:", url_path="step"),
    st.Page(ROOT / "pages" / "race.py", title="Race", icon=":material/sports_score:", url_path="race"),
    st.Page(ROOT / "pages" / "lesson.py", title="How it works", icon=":material/school:", url_path="lesson"),
    st.Page(ROOT / "pages" / "production.py", title="Road to production", icon=":material/rocket_launch:", url_path="production"),
], "Measure": [
    st.Page(ROOT / "pages" / "workloads.py", title="Workloads", icon=":material/table_chart:", url_path="workloads"),
    st.Page(ROOT / "pages" / "temperature.py", title="Temperature", icon=":material/thermostat:", url_path="temperature"),
    st.Page(ROOT / "pages" / "batch.py", title="Batch size", icon=":material/stacks:", url_path="batch"),
    st.Page(ROOT / "pages" / "draft_length.py", title="Draft length k", icon=":material/straighten:", url_path="draft-length"),
    st.Page(ROOT / "pages" / "contract.py", title="Output contract", icon=":material/fact_check:", url_path="contract"),
]})
runs.settle()
classroom.load()
sidebar.build()
classroom.build()
nav.run()
