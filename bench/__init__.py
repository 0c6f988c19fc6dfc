"""The fleet benchmark (``bash bench/run.sh``) and its helpers; see bench/run.py."""
