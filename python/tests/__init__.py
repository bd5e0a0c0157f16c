# tests: the fattn package's tests, run from python/ as `python3 -m unittest tests.test_binding`
# (make python-test names the library built in build/).
