"""The runtime's C API (runtime/reshard.h) through ctypes: open a plan, a Gloo
transport, a session; bind a rank's own tensors by buffer name and run."""
import ctypes

DTYPES = {"torch.bfloat16": 0, "torch.float16": 1, "torch.float32": 2, "torch.float8_e4m3fn": 3,
          "torch.float8_e8m0fnu": 4}


class Stats(ctypes.Structure):
    _fields_ = [("net_bytes_sent", ctypes.c_uint64), ("net_bytes_received", ctypes.c_uint64),
                ("nvlink_bytes_sent", ctypes.c_uint64), ("nvlink_bytes_received", ctypes.c_uint64),
                ("net_seconds", ctypes.c_double), ("nvlink_seconds", ctypes.c_double),
                ("steps", ctypes.c_uint64), ("rounds", ctypes.c_uint32), ("seconds", ctypes.c_double)]


class ReshardError(RuntimeError):
    pass


class Runtime:
    def __init__(self, lib_path):
        L = ctypes.CDLL(lib_path)
        vp, u32, cp = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_char_p
        L.reshard_last_error.restype = cp
        L.reshard_plan_open.restype, L.reshard_plan_open.argtypes = vp, [cp]
        L.reshard_plan_num_ranks.restype, L.reshard_plan_num_ranks.argtypes = u32, [vp]
        L.reshard_plan_close.argtypes = [vp]
        L.reshard_gloo_transport_create.restype = vp
        L.reshard_gloo_transport_create.argtypes = [u32, u32, cp, cp, cp, ctypes.c_double]
        L.reshard_transport_destroy.argtypes = [vp]
        L.reshard_session_create.restype, L.reshard_session_create.argtypes = vp, [vp, u32, vp]
        L.reshard_session_num_buffers.restype, L.reshard_session_num_buffers.argtypes = u32, [vp]
        L.reshard_session_buffer_name.restype, L.reshard_session_buffer_name.argtypes = cp, [vp, u32]
        L.reshard_session_bind.restype = ctypes.c_int
        L.reshard_session_bind.argtypes = [vp, cp, vp, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        L.reshard_session_run.restype, L.reshard_session_run.argtypes = ctypes.c_int, [vp, ctypes.POINTER(Stats)]
        L.reshard_session_destroy.argtypes = [vp]
        self.L = L

    def _check(self, ok, what):
        if not ok:
            raise ReshardError(f"{what}: {self.L.reshard_last_error().decode()}")

    def refit(self, plan_path, rank, store_dir, tensors, timeout_s=120.0):
        """Runs `rank`'s program of the plan over Gloo, binding `tensors` (a
        dict buffer name -> contiguous CPU torch tensor); every buffer the rank
        binds must be there. Returns the run's Stats."""
        L = self.L
        plan = L.reshard_plan_open(plan_path.encode())
        self._check(plan, plan_path)
        size = L.reshard_plan_num_ranks(plan)
        tr = L.reshard_gloo_transport_create(rank, size, store_dir.encode(), None, None, timeout_s)
        self._check(tr, f"rank {rank}: gloo transport")
        sess = L.reshard_session_create(plan, rank, tr)
        self._check(sess, f"rank {rank}: session")
        try:
            for i in range(L.reshard_session_num_buffers(sess)):
                name = L.reshard_session_buffer_name(sess, i).decode()
                if name not in tensors:
                    raise ReshardError(f"rank {rank}: the plan binds '{name}', which this rank does not hold")
                t = tensors[name]
                assert t.is_contiguous() and t.device.type == "cpu", name
                shape = (ctypes.c_uint64 * t.dim())(*t.shape)
                self._check(L.reshard_session_bind(sess, name.encode(), ctypes.c_void_p(t.data_ptr()),
                                                   DTYPES[str(t.dtype)], shape, t.dim()) == 0,
                            f"rank {rank}: bind {name}")
            stats = Stats()
            self._check(L.reshard_session_run(sess, ctypes.byref(stats)) == 0, f"rank {rank}: run")
            return stats
        finally:
            L.reshard_session_destroy(sess)
            L.reshard_transport_destroy(tr)
            L.reshard_plan_close(plan)
