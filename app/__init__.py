"""The Streamlit front end: it asks the engine for StepRecords and draws them; it never calls a model itself."""
