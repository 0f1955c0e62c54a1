"""The hostile-guest suite: each test tries to break one rule of the security model.

Where each finding of the security review is tried (README, "Security model"):

1. NVRTC options that write host files (--time, --create-pch, ...): test_nvrtc.py
2. #include / -I quoting host files into the build log: test_nvrtc.py
3. a VM named 'vm1#1' taking vm1's vGPU 1: test_names.py
4. host memory outside any quota (lying lengths, staging per connection, no
   connection limit): test_payload_bounds.py, test_refusals.py
5. HELLO with a payload, any exception in a session: test_session_faults.py
6. refused connections holding agent threads: test_refusals.py
7. a malformed executor message stopping the agent: test_executor_lane.py
8. device memory that is not a MEM_ALLOC (module variables, granularity):
   test_accounting.py
9. a kernel fault poisoning the VM's later programs: test_faults.py, and on the
   GPU test_faults_gpu.py
10. state that vanishes or is silently wrong: test_state.py
11. a compile cache shared by all VMs and unbounded: test_nvrtc.py
12. sockets under umask 000, two agents on one state or control socket:
    test_single_agent.py
13. executors outliving the agent, sessions lingering: test_executor_lifetime.py,
    test_session_faults.py
14. a guest that hangs on a silent agent: test_guest_timeouts.py

Device memory through virtual memory management and memory pools (the quota,
another connection's handles and ranges, exportable memory, a disconnect):
test_vmm.py, and random sequences of those calls: test_vmm_sequences.py; a
pool giving memory back while another connection's module load
is measured: test_accounting.py.

The executor's C loop of one-way frames keeps the Python path's rules:
test_burst_refusals.py (handles, allocations, malformed frames) and
test_burst_vmm.py (pool and mapped memory the guest let go).

Executors unprivileged and confined: test_executor_sandbox.py; everything at
once, for a while: test_fuzz.py (single frames of every op) and
test_fuzz_stateful.py (sequences that keep and abuse handles: graphs, virtual
memory, pools, regions, the control lane).
"""
