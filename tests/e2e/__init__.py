"""Infrastructure of the end-to-end test (tests/test_e2e_jupyterlab.py): a JupyterLab
server started the README's way, Debian's Chromium driven by Playwright, and the steps
a person takes in a notebook. Not part of the package."""
