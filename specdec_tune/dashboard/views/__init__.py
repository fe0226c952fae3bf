"""Page scripts of the Streamlit app (run by ``st.navigation``, not imported)."""
