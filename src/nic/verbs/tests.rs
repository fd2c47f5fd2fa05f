//! Tests of the verbs backend that need no device: pure helpers and the C struct layouts
//! rdma-sys writes by hand here; the reimplemented inlines and attaching to an opened context,
//! against fake provider structs, in `tests/fake_provider.rs`. The device tests here pass
//! whether or not a device is present.

mod fake_provider;

use super::conv::rereg_args;
use super::device::{
    RXE_VENDOR_ID, SIW_VENDOR_ID, c_chars_to_string, device_names, guess_driver, mtu_bytes,
    parse_numa_node,
};
use super::inlines::completion;
use super::qp_attr::qp_state;
use super::*;
use crate::nic::types::{WcOpcode, WcStatus};
use std::ffi::c_char;
use std::mem::offset_of;

// -- devices ------------------------------------------------------------------------------

#[test]
fn open_first_agrees_with_the_device_list() {
    let names = device_names();
    match VerbsNic::open(None) {
        Err(Error::NoDevice) => assert!(names.is_empty(), "devices {names:?} but NoDevice"),
        Ok(nic) => {
            assert!(
                names.contains(&nic.caps.name),
                "{} not in {names:?}",
                nic.caps.name
            );
            assert!(!nic.caps.driver.is_empty());
            assert!(nic.caps.max_mr > 0 && nic.caps.max_cqe > 0 && nic.caps.max_sge > 0);
            assert_eq!(nic.is_rxe(), nic.caps.driver == "rxe");
            assert_eq!(nic.kind(), NicKind::Verbs);
        }
        Err(e) => assert!(
            !names.is_empty() && !matches!(e, Error::DeviceNotFound(_)),
            "devices {names:?}, open(None) failed with {e:?}"
        ),
    }
}

#[test]
fn open_unknown_name_is_not_found() {
    // With devices or without, the error names the device asked for.
    let err = VerbsNic::open(Some("no-such-dev")).unwrap_err();
    assert!(
        matches!(&err, Error::DeviceNotFound(n) if n == "no-such-dev"),
        "{err:?}"
    );
}

// -- pure helpers -------------------------------------------------------------------------

#[test]
fn mtu_enum_to_bytes() {
    use ffi::ibv_mtu::*;
    let got: Vec<u32> = [
        IBV_MTU_256,
        IBV_MTU_512,
        IBV_MTU_1024,
        IBV_MTU_2048,
        IBV_MTU_4096,
        0,
        6,
    ]
    .into_iter()
    .map(mtu_bytes)
    .collect();
    assert_eq!(got, [256, 512, 1024, 2048, 4096, 0, 0]);
}

#[test]
fn qp_states_map_to_the_three_the_pool_knows() {
    use ffi::ibv_qp_state::*;
    for (s, want) in [
        (IBV_QPS_RESET, QpState::Init),
        (IBV_QPS_INIT, QpState::Init),
        (IBV_QPS_RTR, QpState::Init),
        (IBV_QPS_RTS, QpState::Ready),
        (IBV_QPS_SQD, QpState::Ready),
        (IBV_QPS_SQE, QpState::Error),
        (IBV_QPS_ERR, QpState::Error),
    ] {
        assert_eq!(qp_state(s), want, "state {s}");
    }
}

#[test]
fn driver_names() {
    assert_eq!(guess_driver("rxe0", RXE_VENDOR_ID, false, None), "rxe");
    // Any name: rdma link add may call an rxe device anything.
    assert_eq!(
        guess_driver("roce_veth0", RXE_VENDOR_ID, false, Some("virtio_net")),
        "rxe"
    );
    // Pre-5.5 kernels report vendor 0 for rxe; the name still tells.
    assert_eq!(guess_driver("rxe1", 0, false, None), "rxe");
    assert_eq!(guess_driver("siw0", SIW_VENDOR_ID, false, None), "siw");
    assert_eq!(
        guess_driver("mlx5_0", 0x02c9, false, Some("mlx5_core")),
        "mlx5"
    );
    assert_eq!(guess_driver("ib0", 0x02c9, true, None), "mlx5");
    assert_eq!(
        guess_driver("ib0", 0x02c9, false, Some("mlx4_core")),
        "mlx4"
    );
    assert_eq!(guess_driver("bnxt_re0", 0x14e4, false, None), "bnxt_re");
    assert_eq!(guess_driver("foo3", 1, false, None), "foo");
    assert_eq!(guess_driver("42", 1, false, None), "unknown");
}

#[test]
fn rereg_passes_each_argument_only_with_its_flag() {
    let a = Access::LOCAL_WRITE | Access::REMOTE_READ;
    let none = Access::empty();
    let f = ReregFlags::CHANGE_TRANSLATION;
    assert_eq!(
        rereg_args(f, 7, 0x1000, 4096, a),
        MrAttrs {
            pd: 0,
            addr: 0x1000,
            len: 4096,
            access: none
        }
    );
    let f = ReregFlags::CHANGE_PD;
    assert_eq!(
        rereg_args(f, 7, 0x1000, 4096, a),
        MrAttrs {
            pd: 7,
            addr: 0,
            len: 0,
            access: none
        }
    );
    let f = ReregFlags::CHANGE_ACCESS;
    assert_eq!(
        rereg_args(f, 7, 0x1000, 4096, a),
        MrAttrs {
            pd: 0,
            addr: 0,
            len: 0,
            access: a
        }
    );
    let f = ReregFlags::all();
    assert_eq!(
        rereg_args(f, 7, 0x1000, 4096, a),
        MrAttrs {
            pd: 7,
            addr: 0x1000,
            len: 4096,
            access: a
        }
    );
}

#[test]
fn null_handles_are_refused() {
    // (The return-code half of this test moved to `error.rs` with the errno helpers.)
    assert!(matches!(
        obj::<ffi::ibv_pd>(Verb::AllocPd, 0),
        Err(Error::InvalidArgument { .. })
    ));
}

/// rdma-sys defines these by hand (bindgen cannot); the numbers are `sizeof`/`offsetof` from
/// rdma-core's verbs.h on LP64.
#[test]
#[cfg(target_pointer_width = "64")]
fn hand_written_rdma_sys_structs_match_verbs_h() {
    assert_eq!(size_of::<ffi::ibv_send_wr>(), 128);
    assert_eq!(
        offset_of!(ffi::ibv_send_wr, imm_data_invalidated_rkey_union),
        36
    );
    assert_eq!(offset_of!(ffi::ibv_send_wr, wr), 40);
    assert_eq!(offset_of!(ffi::ibv_send_wr, qp_type), 72);
    assert_eq!(offset_of!(ffi::ibv_send_wr, bind_mw_tso_union), 80);
    assert_eq!(offset_of!(ffi::bind_mw_t, rkey), 8);
    assert_eq!(offset_of!(ffi::bind_mw_t, bind_info), 16);
    assert_eq!(size_of::<ffi::ibv_wc>(), 48);
    assert_eq!(offset_of!(ffi::ibv_wc, imm_data_invalidated_rkey_union), 24);
    assert_eq!(offset_of!(ffi::ibv_wc, qp_num), 28);
    assert_eq!(offset_of!(ffi::ibv_wc, wc_flags), 36);
    assert_eq!(size_of::<ffi::ibv_mw_bind>(), 48);
    assert_eq!(offset_of!(ffi::ibv_mw_bind, bind_info), 16);
    assert_eq!(size_of::<ffi::ibv_ah_attr>(), 32);
    assert_eq!(size_of::<ffi::ibv_qp_attr>(), 144);
    assert_eq!(offset_of!(ffi::ibv_qp_attr, ah_attr), 56);
}

#[test]
fn work_completions() {
    // SAFETY: all-zero is a valid ibv_wc.
    let mut wc: ffi::ibv_wc = unsafe { std::mem::zeroed() };
    wc.wr_id = 9;
    wc.status = ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR;
    wc.opcode = ffi::ibv_wc_opcode::IBV_WC_RDMA_READ;
    wc.qp_num = 0x11;
    wc.imm_data_invalidated_rkey_union.invalidated_rkey = 0x1234;
    let c = completion(&wc);
    assert_eq!(
        c,
        Completion {
            wr_id: 9,
            status: WcStatus::RemAccessErr,
            opcode: WcOpcode::RdmaRead,
            byte_len: 0,
            qp_num: 0x11,
            invalidated_rkey: None,
            imm_data: None,
        }
    );
    wc.status = ffi::ibv_wc_status::IBV_WC_SUCCESS;
    wc.opcode = ffi::ibv_wc_opcode::IBV_WC_RECV;
    wc.byte_len = 64;
    wc.wc_flags = ffi::ibv_wc_flags::IBV_WC_WITH_INV.0;
    let c = completion(&wc);
    assert_eq!(
        (c.opcode, c.byte_len, c.invalidated_rkey),
        (WcOpcode::Recv, 64, Some(Rkey(0x1234)))
    );
    // Immediate data is big-endian in `ibv_wc`, host order in `Completion`.
    wc.opcode = ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM;
    wc.wc_flags = ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0;
    wc.imm_data_invalidated_rkey_union.imm_data = 0x0102_0304u32.to_be();
    let c = completion(&wc);
    assert_eq!(
        (c.opcode, c.imm_data, c.invalidated_rkey),
        (WcOpcode::RecvRdmaWithImm, Some(0x0102_0304), None)
    );
    for (raw, want) in [
        (ffi::ibv_wc_opcode::IBV_WC_SEND, WcOpcode::Send),
        (ffi::ibv_wc_opcode::IBV_WC_RDMA_WRITE, WcOpcode::RdmaWrite),
        (ffi::ibv_wc_opcode::IBV_WC_BIND_MW, WcOpcode::BindMw),
        (ffi::ibv_wc_opcode::IBV_WC_LOCAL_INV, WcOpcode::LocalInv),
        (ffi::ibv_wc_opcode::IBV_WC_COMP_SWAP, WcOpcode::CompareSwap),
        (ffi::ibv_wc_opcode::IBV_WC_FETCH_ADD, WcOpcode::FetchAdd),
        (ffi::ibv_wc_opcode::IBV_WC_TSO, WcOpcode::Other(7)),
    ] {
        wc.opcode = raw;
        assert_eq!(completion(&wc).opcode, want);
    }
}

#[test]
fn c_chars_stop_at_nul() {
    let buf: Vec<c_char> = b"rxe0\0junk".iter().map(|&b| b as c_char).collect();
    assert_eq!(c_chars_to_string(&buf), "rxe0");
    let full: Vec<c_char> = b"mlx5_0".iter().map(|&b| b as c_char).collect();
    assert_eq!(c_chars_to_string(&full), "mlx5_0");
}

#[test]
fn sysfs_numa_nodes_parse() {
    assert_eq!(parse_numa_node("1\n"), Some(1));
    assert_eq!(parse_numa_node("0"), Some(0));
    assert_eq!(parse_numa_node("-1\n"), None);
    assert_eq!(parse_numa_node(""), None);
    assert_eq!(parse_numa_node("x"), None);
}
