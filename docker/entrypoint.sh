#!/bin/sh
# `bert serve [flags]` runs the service, `bert train [flags]` the trainer; anything else runs as given.
set -e
command="${1:-serve}"
[ "$#" -gt 0 ] && shift
case "$command" in
  serve) exec python -m service "$@" ;;
  train) exec python -m trainer "$@" ;;
  *) exec "$command" "$@" ;;
esac
