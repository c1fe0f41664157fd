#!/bin/bash
# The server's CPU for reading a table three ways: COPY, key-range chunks of 10,000 rows (the
# backfill's chunk query: an index scan in key order) and physical chunks of about as many rows
# (a TID Range Scan, PostgreSQL 14+), for a table keyed in load order (bigint) and one keyed at
# random (uuid). docs/benchmarks.md, "ctid chunks, measured"; docs/adr/0010-ctid-chunks.md.
#
# Run it on the database server's machine (it reads the backend's CPU time from /proc) against
# a scratch database, e.g.:
#   PSQL="psql -X -q -h /tmp -p 5432 -U postgres -d scratch" ROWS=1000000 REPS=6 docs/bench/ctid-chunks.sh
# It creates and leaves the tables ctid_serial and ctid_uuid there.
set -euo pipefail
PSQL=${PSQL:?set PSQL to a psql command line for a scratch database}
ROWS=${ROWS:-1000000}
REPS=${REPS:-6}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# run NAME FILE: runs FILE's statements in one session, output discarded; prints the backend's
# CPU seconds and the wall seconds.
run() {
  coproc PS { $PSQL -At -f - 2>&1; }
  echo "SELECT pg_backend_pid();" >&"${PS[1]}"
  local pid c0 c1 t0 t1 line
  read -r pid <&"${PS[0]}"
  c0=$(cpu "$pid") t0=$(date +%s.%N)
  { echo '\o /dev/null'; cat "$2"; echo '\o'; echo "SELECT 'done';"; } >&"${PS[1]}"
  while read -r line <&"${PS[0]}"; do [ "$line" = done ] && break; done
  c1=$(cpu "$pid") t1=$(date +%s.%N)
  exec {PS[1]}>&-
  wait "$PS_PID" 2>/dev/null || true
  printf '%s backend_cpu_s=%.2f wall_s=%.2f\n' "$1" "$(echo "($c1 - $c0) / 100" | bc -l)" "$(echo "$t1 - $t0" | bc -l)"
}

# prepare TABLE KEYTYPE KEYEXPR: the bench table's columns under another key.
prepare() {
  $PSQL -c "DROP TABLE IF EXISTS $1" \
    -c "CREATE TABLE $1 (id $2 PRIMARY KEY, k int, v text, ts timestamptz, n numeric, j jsonb)" \
    -c "INSERT INTO $1 SELECT $3, g % 1000, md5(g::text) || repeat('x', 20 + g % 40), now() - g * interval '1 second', (g * 1.0001)::numeric(20, 4), jsonb_build_object('a', g, 'b', md5(g::text)) FROM generate_series(1, $ROWS) g" \
    -c "VACUUM ANALYZE $1"
  # Key-range chunks from each chunk's last key, as the backfill reads them.
  local prev="" b
  : > "$dir/$1.keyset"
  while read -r b; do
    if [ -z "$prev" ]; then
      echo "BEGIN; SET LOCAL enable_sort = off; SELECT * FROM $1 ORDER BY id LIMIT 10000; COMMIT;"
    else
      echo "BEGIN; SET LOCAL enable_sort = off; SELECT * FROM $1 WHERE id > '$prev' ORDER BY id LIMIT 10000; COMMIT;"
    fi >> "$dir/$1.keyset"
    prev=$b
  done < <($PSQL -At -c "SELECT id FROM (SELECT id, row_number() OVER (ORDER BY id) r FROM $1) x WHERE r % 10000 = 0 ORDER BY id")
  echo "BEGIN; SET LOCAL enable_sort = off; SELECT * FROM $1 WHERE id > '$prev' ORDER BY id LIMIT 10000; COMMIT;" >> "$dir/$1.keyset"
  # Physical chunks of about 10,000 rows; the last one open-ended.
  local pages per
  pages=$($PSQL -At -c "SELECT relpages FROM pg_class WHERE oid = '$1'::regclass")
  per=$(( (pages * 10000 + ROWS - 1) / ROWS ))
  : > "$dir/$1.ctid"
  for ((b = 0; b + per < pages; b += per)); do
    echo "BEGIN; SELECT * FROM $1 WHERE ctid >= '($b,0)'::tid AND ctid < '($((b + per)),0)'::tid; COMMIT;" >> "$dir/$1.ctid"
  done
  echo "BEGIN; SELECT * FROM $1 WHERE ctid >= '($b,0)'::tid; COMMIT;" >> "$dir/$1.ctid"
  echo "COPY $1 TO STDOUT;" > "$dir/$1.copy"
}

prepare ctid_serial bigint g
prepare ctid_uuid uuid gen_random_uuid\(\)
for ((rep = 1; rep <= REPS; rep++)); do
  for t in ctid_serial ctid_uuid; do
    run "$t.copy" "$dir/$t.copy"
    run "$t.keyset" "$dir/$t.keyset"
    run "$t.ctid" "$dir/$t.ctid"
  done
done | sort | awk '{ split($2, c, "="); split($3, w, "="); cpu[$1] = cpu[$1] " " c[2]; wall[$1] = wall[$1] " " w[2] }
  END { for (k in cpu) printf "%-18s backend CPU s:%s  wall s:%s\n", k, cpu[k], wall[k] }' | sort
