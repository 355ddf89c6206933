# make demo | make test | make lab -- each creates or refreshes .venv when requirements change.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HASH_FILE := $(VENV)/.requirements.sha256
# each run of make demo gets its own folder (a second run never mixes with the first)
DEMO_OUT ?= out/demo/$(shell date +%Y%m%d-%H%M%S)

.PHONY: venv demo test lab nbfilter browser-deps clean wheelhouse

venv:
	@h=$$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1); \
	if [ ! -x $(PY) ] || [ "$$(cat $(HASH_FILE) 2>/dev/null)" != "$$h" ]; then \
		echo "fastdiff: setting up $(VENV) from requirements.txt (first time: a few minutes)"; \
		[ -x $(PY) ] || $(PYTHON) -m venv $(VENV); \
		$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt && \
		$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e . && \
		echo "$$h" > $(HASH_FILE) || exit 1; \
	else \
		echo "fastdiff: $(VENV) is up to date"; \
	fi

demo: venv
	$(PY) -m fastdiff_helpers demo --out $(DEMO_OUT)

# Chromium for the browser test comes from Debian (never `playwright install`).
browser-deps:
	@if [ ! -x /usr/bin/chromium ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "fastdiff: installing Debian's chromium for the browser test"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
		else \
			echo "fastdiff: /usr/bin/chromium missing; run 'sudo apt-get install chromium' (the browser test is skipped without it)"; \
		fi; \
	fi

# Two phases (tools/test_suite.py): the tests spread over pytest-xdist workers, then the ones
# that compare wall-clock times with the machine to themselves; it ends with the slowest tests
# and the total. ARGS go to pytest (make test ARGS="-k notebooks").
ARGS ?=
test: venv browser-deps
	$(PY) tools/test_suite.py $(ARGS)

# As root (common on rented GPU machines) JupyterLab refuses to start without --allow-root.
# LAB_IP=0.0.0.0 listens on every interface (a remote machine); LAB_PORT picks the port.
# tools/jupyterlab/overrides.json answers JupyterLab's "Jupyter news?" question (a pop-up over
# every page otherwise) with no, as does news_url=None on the server; Settings can change it.
LAB_IP ?= 127.0.0.1
LAB_PORT ?= 8888
# A notebook run and saved keeps its outputs in its file; git stores it without them (nbfilter),
# and the post-save hook keeps `git status` clean while only outputs changed (tools/nbclean.py; the
# server finds it through PYTHONPATH: tools/ is the clone's, not the installed package's).
lab: venv nbfilter
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(VENV)/bin/jupyter lab --no-browser --ip $(LAB_IP) --port $(LAB_PORT) \
		--LabApp.news_url=None --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate \
		--LabApp.app_settings_dir=$(CURDIR)/tools/jupyterlab \
		--ContentsManager.post_save_hook=tools.nbclean.post_save \
		$$([ "$$(id -u)" = 0 ] && echo --allow-root) notebooks/

# .gitattributes sends notebooks/*.ipynb through the filter fastdiff-notebook; this defines it in
# the clone's git config (a clone never gets config from upstream): `git add` stores a notebook
# cleaned by tools/nbclean.py (python3 and its standard library, no .venv),
# `git diff` compares through it. `required`: a notebook the filter cannot read stops `git add`
# instead of going in as it is; a required filter also needs a smudge command, else every
# checkout of a notebook fails (git's convert.c), so `cat` writes it out as stored. Only at the
# top of a git work tree; idempotent.
NBFILTER_CLEAN := $(PYTHON) tools/nbclean.py
nbfilter:
	@if command -v git >/dev/null && cdup=$$(git rev-parse --show-cdup 2>/dev/null) && \
		[ -z "$$cdup" ] && [ "$$(git rev-parse --is-inside-work-tree)" = true ]; then \
		if [ "$$(git config --get filter.fastdiff-notebook.clean)" != "$(NBFILTER_CLEAN)" ] || \
			[ "$$(git config --get filter.fastdiff-notebook.smudge)" != cat ] || \
			[ "$$(git config --type=bool --get filter.fastdiff-notebook.required)" != true ]; then \
			git config filter.fastdiff-notebook.clean "$(NBFILTER_CLEAN)" && \
			git config filter.fastdiff-notebook.smudge cat && \
			git config filter.fastdiff-notebook.required true && \
			echo "fastdiff: git now stores notebooks/*.ipynb without outputs; your files keep them"; \
		fi; \
	fi

# Wheels for an offline GPU machine that has its own torch (docs/offline-gpu.md).
# HAVE: that machine's `python3 -m pip freeze` file, or a list "torch==2.11.0 ..."; needs only
# python3 and pip here (no .venv). WH_PYTHON: the machine's Python (default: HAVE's, else 3.12).
HAVE ?=
WH_PYTHON ?=
WH_PLATFORM ?= manylinux_2_28_x86_64
wheelhouse:
	$(PYTHON) tools/wheelhouse.py --have "$(HAVE)" $(if $(WH_PYTHON),--python $(WH_PYTHON)) \
		--platform $(WH_PLATFORM) --out wheelhouse

clean:
	rm -rf $(VENV) out .pytest_cache
