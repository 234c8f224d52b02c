#!/bin/sh
# `bert serve [flags]` runs the service, `bert train [flags]` the trainer, `bert corpus embed [flags]` the
# corpus job, `bert health` checks the service on $BERT_PORT (the image's and compose's healthcheck); anything
# else runs as given.
set -e
command="${1:-serve}"
[ "$#" -gt 0 ] && shift
case "$command" in
  serve) exec python -m service "$@" ;;
  train) exec python -m trainer "$@" ;;
  corpus) exec python -m corpus "$@" ;;
  health) exec python -c "import os, sys, urllib.request
url = 'http://127.0.0.1:%s/health' % (os.environ.get('BERT_PORT') or '8000')
try:
    sys.exit(0 if urllib.request.urlopen(url, timeout=2).status == 200 else 1)
except Exception as exc:
    print(exc)
    sys.exit(1)" ;;
  *) exec "$command" "$@" ;;
esac
