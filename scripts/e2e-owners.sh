# e2e-owners.sh: who made each kind cluster of the e2e test, sourced by scripts/e2e.sh and .ci/run.
#
# A kind cluster outlives the run that made it when that run is killed outright (a closed
# terminal, a session that ends, go test's own timeout). Its control plane, etcd and kubelet then
# keep a tenth of a core busy, and every later timing on the machine pays for it: one such cluster
# failed a CI run's latency checks. So each run records itself as its cluster's owner, and a later
# run deletes the clusters whose owner no longer runs.
#
# A record is $LOADSHED_CACHE/e2e-clusters/NAME holding "PID STARTTIME" of the owning shell:
# STARTTIME (field 22 of /proc/PID/stat) tells a process from a later one given the same PID.
# Clusters named loadshed-e2e-* with no record (kept with E2E_KEEP_CLUSTER=1, or made by go test
# run by hand) are reported, never deleted.

e2e_owners_dir() { echo "${LOADSHED_CACHE:-$HOME/.cache/loadshed}/e2e-clusters"; }

# e2e_proc_start PID: the process's start time in clock ticks since boot; fails when it does not run.
e2e_proc_start() {
	local stat
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	# The command name (field 2) may hold spaces and parentheses: the fields after it follow the
	# last ") ". Field 3 is then the first, field 22 the twentieth.
	stat=${stat##*) }
	local -a f
	read -r -a f <<<"$stat"
	[[ -n ${f[19]:-} ]] || return 1
	echo "${f[19]}"
}

# e2e_owner_claim NAME: records this shell ($$) as the owner of cluster NAME.
e2e_owner_claim() {
	local dir st
	dir=$(e2e_owners_dir)
	st=$(e2e_proc_start $$) || return 1
	mkdir -p "$dir"
	echo "$$ $st" >"$dir/$1"
}

# e2e_owner_release NAME: forgets NAME's owner (the cluster is gone, or kept on purpose).
e2e_owner_release() { rm -f "$(e2e_owners_dir)/$1"; }

# e2e_reap_stale KIND [SKIP]: deletes every loadshed-e2e-* cluster whose recorded owner no longer
# runs, and reports the ones nobody owns and the ones another live run owns. SKIP is a name
# left alone (the caller's own).
e2e_reap_stale() {
	local kind=$1 skip=${2:-} dir name pid st now
	[[ -x $kind ]] || return 0
	dir=$(e2e_owners_dir)
	for name in $("$kind" get clusters 2>/dev/null); do
		[[ $name == loadshed-e2e-* && $name != "$skip" ]] || continue
		if [[ ! -f $dir/$name ]]; then
			echo "e2e-owners: WARNING: kind cluster $name is running and no e2e run owns it; it takes CPU from every timing on this machine (kind delete cluster --name $name)" >&2
			continue
		fi
		pid= st=
		read -r pid st <"$dir/$name" || true
		if [[ $pid =~ ^[0-9]+$ ]] && now=$(e2e_proc_start "$pid") && [[ $now == "$st" ]]; then
			echo "e2e-owners: kind cluster $name belongs to a running e2e (pid $pid); both share this machine's CPU" >&2
			continue
		fi
		echo "e2e-owners: deleting kind cluster $name, left by an e2e run that no longer exists (pid ${pid:-?})" >&2
		# A failed delete keeps the record: the next run tries again.
		if "$kind" delete cluster --name "$name" >&2; then
			rm -f "$dir/$name"
		fi
	done
	return 0
}
