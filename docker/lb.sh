#!/bin/sh
# nginx in front of every `api-replica` container: the replica list comes from Docker's DNS, and is
# re-read every 5 s, so replicas that `docker compose up --scale api-replica=N` adds or removes later are
# picked up (nginx resolves an upstream's names only at start). Runs nginx in the foreground of this
# script's life; SIGTERM stops nginx gracefully.
set -eu
SERVICE=${LB_SERVICE:-api-replica}
PORT=${LB_PORT:-8000}
LIST=/etc/nginx/bert/replicas.conf
KEEPALIVE=${LB_CLIENT_KEEPALIVE:-0}  # see nginx.conf: 0 loses nothing on reloads
mkdir -p /etc/nginx/bert
case $KEEPALIVE in
  *[!0-9smh]*|'') echo "bert-lb: LB_CLIENT_KEEPALIVE must be a duration like 0, 75s or 2m, not '$KEEPALIVE'" >&2; exit 2 ;;
esac
echo "keepalive_timeout $KEEPALIVE;" > /etc/nginx/bert/client-keepalive.conf

resolve() {  # the service's addresses, one per line, sorted (glibc getent, else busybox nslookup)
  { getent ahostsv4 "$SERVICE" 2>/dev/null || nslookup "$SERVICE" 2>/dev/null | awk '/^Address/ {print $NF}'; } \
    | awk '{print $1}' | grep -E '^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$' | sort -u
}

write_list() {  # $1: addresses
  tmp="$LIST.tmp"
  if [ -n "$1" ]; then
    for ip in $1; do echo "server $ip:$PORT max_fails=1 fail_timeout=10s;"; done > "$tmp"
  else
    echo "server 127.0.0.1:9 down;  # no replica resolved yet" > "$tmp"
  fi
  mv "$tmp" "$LIST"
}

current=$(resolve)
write_list "$current"
nginx -g 'daemon off;' &
nginx_pid=$!
trap 'kill -QUIT "$nginx_pid" 2>/dev/null; wait "$nginx_pid"; exit 0' TERM INT
echo "bert-lb: replicas: $(echo $current)"
while kill -0 "$nginx_pid" 2>/dev/null; do
  sleep 5 &
  wait $! || true
  found=$(resolve)
  if [ "$found" != "$current" ]; then
    current=$found
    write_list "$current"
    nginx -s reload && echo "bert-lb: replicas now: $(echo $current)"
  fi
done
wait "$nginx_pid"
