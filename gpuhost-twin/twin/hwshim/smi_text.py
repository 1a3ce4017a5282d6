"""nvidia-smi's fixed text, as captured (tests/fixtures/captures/h200x2): the no-driver message,
the CUDA version per driver branch, the topo legends, the plain table's frame, the -q block."""

NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)
# CUDA version the driver branch reports (580: captured; the others from NVIDIA's release notes).
CUDA_BY_BRANCH = {
    535: "12.2",
    550: "12.4",
    560: "12.6",
    565: "12.7",
    570: "12.8",
    575: "12.9",
    580: "13.0",
    590: "13.1",
    595: "13.2",
}
TOPO_LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""
P2P_LEGEND = """
Legend:

  X    = Self
  OK   = Status Ok
  CNS  = Chipset not supported
  GNS  = GPU not supported
  TNS  = Topology not supported
  NS   = Not supported
  U    = Unknown
"""
BAR = "+-----------------------------------------+------------------------+----------------------+"
PLAIN_HEAD = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI {ver:<23}Driver Version: {ver:<15}CUDA Version: {cuda:<9}|
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
"""
PLAIN_TAIL = """
+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
|  No running processes found                                                             |
+-----------------------------------------------------------------------------------------+
"""
# `nvidia-smi -q` per-GPU block from the capture: "<indent>Key : value"; values in braces are
# filled per GPU, the rest is the H200 capture verbatim (keys are padded to column 55 on output).
Q_BLOCK = """\
    Product Name : {name}
    Product Brand : NVIDIA
    Product Architecture : {arch}
    Display Mode : Requested functionality has been deprecated
    Display Attached : Yes
    Display Active : Disabled
    Persistence Mode : {persistence}
    Addressing Mode : None
    MIG Mode
        Current : {mig}
        Pending : {mig}
    Accounting Mode : Disabled
    Accounting Mode Buffer Size : 4000
    Driver Model
        Current : N/A
        Pending : N/A
    Serial Number : {serial}
    GPU UUID : {uuid}
    GPU PDI : {pdi}
    Minor Number : {minor}
    VBIOS Version : {vbios}
    MultiGPU Board : No
    Board ID : {board_id}
    Board Part Number : {board_part}
    GPU Part Number : {gpu_part}
    FRU Part Number : N/A
    Platform Info
        Chassis Serial Number : N/A
        Slot Number : N/A
        Tray Index : N/A
        Host ID : N/A
        Peer Type : N/A
        Module Id : {module_id}
        GPU Fabric GUID : N/A
    Inforom Version
        Image Version : G520.0282.02.02
        OEM Object : 2.1
        ECC Object : 7.16
        Power Management Object : N/A
    Inforom BBX Object Flush
        Latest Timestamp : N/A
        Latest Duration : N/A
    GPU Operation Mode
        Current : N/A
        Pending : N/A
    GPU C2C Mode : Disabled
    GPU Virtualization Mode
        Virtualization Mode : Pass-Through
        Host VGPU Mode : N/A
        vGPU Heterogeneous Mode : N/A
    GPU Recovery Action : None
    GSP Firmware Version : {gsp}
    IBMNPU
        Relaxed Ordering Mode : N/A
    PCI
        Bus : {pci_bus}
        Device : {pci_device}
        Domain : {pci_domain}
        Base Classcode : {base_class}
        Sub Classcode : {sub_class}
        Device Id : {device_id}
        Bus Id : {busid}
        Sub System Id : {subsys_id}
        GPU Link Info
            PCIe Generation
                Max : 5
                Current : 5
                Device Current : 5
                Device Max : 5
                Host Max : N/A
            Link Width
                Max : 16x
                Current : 16x
        Bridge Chip
            Type : N/A
            Firmware : N/A
        Replays Since Reset : 0
        Replay Number Rollovers : 0
        Tx Throughput : 1037 KB/s
        Rx Throughput : 550 KB/s
        Atomic Caps Outbound : N/A
        Atomic Caps Inbound : N/A
    Fan Speed : {fan}
    Performance State : P0
    Clocks Event Reasons
        Idle : Active
        Applications Clocks Setting : Not Active
        SW Power Cap : Not Active
        HW Slowdown : Not Active
            HW Thermal Slowdown : Not Active
            HW Power Brake Slowdown : Not Active
        Sync Boost : Not Active
        SW Thermal Slowdown : Not Active
        Display Clock Setting : Not Active
    Clocks Event Reasons Counters
        SW Power Capping : 0 us
        Sync Boost : 0 us
        SW Thermal Slowdown : 0 us
        HW Thermal Slowdown : 0 us
        HW Power Braking : 0 us
    Sparse Operation Mode : Disabled
    FB Memory Usage
        Total : {mem_total} MiB
        Reserved : {mem_reserved} MiB
        Used : 0 MiB
        Free : {mem_free} MiB
    BAR1 Memory Usage
        Total : 262144 MiB
        Used : 1 MiB
        Free : 262143 MiB
    Conf Compute Protected Memory Usage
        Total : 0 MiB
        Used : 0 MiB
        Free : 0 MiB
    Compute Mode : Default
    Utilization
        GPU : 0 %
        Memory : 0 %
        Encoder : 0 %
        Decoder : 0 %
        JPEG : 0 %
        OFA : 0 %
    Encoder Stats
        Active Sessions : 0
        Average FPS : 0
        Average Latency : 0
    FBC Stats
        Active Sessions : 0
        Average FPS : 0
        Average Latency : 0
    DRAM Encryption Mode
        Current : N/A
        Pending : N/A
    ECC Mode
        Current : {ecc}
        Pending : {ecc}
    ECC Errors
        Volatile
            SRAM Correctable : 0
            SRAM Uncorrectable Parity : 0
            SRAM Uncorrectable SEC-DED : 0
            DRAM Correctable : 0
            DRAM Uncorrectable : 0
        Aggregate
            SRAM Correctable : 0
            SRAM Uncorrectable Parity : 0
            SRAM Uncorrectable SEC-DED : 0
            DRAM Correctable : 0
            DRAM Uncorrectable : 0
            SRAM Threshold Exceeded : No
        Aggregate Uncorrectable SRAM Sources
            SRAM L2 : 0
            SRAM SM : 0
            SRAM Microcontroller : 0
            SRAM PCIE : 0
            SRAM Other : 0
        Channel Repair Pending : No
        TPC Repair Pending : No
        Unrepairable Memory : No
    Retired Pages
        Single Bit ECC : N/A
        Double Bit ECC : N/A
        Pending Page Blacklist : N/A
    Remapped Rows
        Correctable Error : 0
        Inactive Correctable Error : 0
        Uncorrectable Error : 0
        Inactive Uncorrectable Error : 0
        Pending : No
        Remapping Failure Occurred : No
        Bank Remap Availability Histogram
            Max : 3072 bank(s)
            High : 0 bank(s)
            Partial : 0 bank(s)
            Low : 0 bank(s)
            None : 0 bank(s)
    Temperature
        GPU Current Temp : {temp} C
        GPU T.Limit Temp : 50 C
        GPU Shutdown T.Limit Temp : -8 C
        GPU Slowdown T.Limit Temp : -2 C
        GPU Max Operating T.Limit Temp : 0 C
        GPU Target Temperature : N/A
        Memory Current Temp : {temp} C
        Memory Max Operating T.Limit Temp : 0 C
    GPU Power Readings
        Average Power Draw : {power_draw}.00 W
        Instantaneous Power Draw : {power_draw}.00 W
        Current Power Limit : {power_limit}.00 W
        Requested Power Limit : {power_limit}.00 W
        Default Power Limit : {power_limit}.00 W
        Min Power Limit : 200.00 W
        Max Power Limit : {power_limit}.00 W
    GPU Memory Power Readings\x20
        Average Power Draw : 37.16 W
        Instantaneous Power Draw : N/A
    Module Power Readings
        Average Power Draw : N/A
        Instantaneous Power Draw : N/A
        Current Power Limit : N/A
        Requested Power Limit : N/A
        Default Power Limit : N/A
        Min Power Limit : N/A
        Max Power Limit : N/A
    Power Smoothing : N/A
    Workload Power Profiles
        Requested Profiles : N/A
        Enforced Profiles : N/A
    Clocks
        Graphics : 525 MHz
        SM : 525 MHz
        Memory : 3201 MHz
        Video : 765 MHz
    Applications Clocks
        Graphics : 1980 MHz
        Memory : 3201 MHz
    Default Applications Clocks
        Graphics : 1980 MHz
        Memory : 3201 MHz
    Deferred Clocks
        Memory : N/A
    Max Clocks
        Graphics : 1980 MHz
        SM : 1980 MHz
        Memory : 3201 MHz
        Video : 1545 MHz
    Max Customer Boost Clocks
        Graphics : 1980 MHz
    Clock Policy
        Auto Boost : N/A
        Auto Boost Default : N/A
    Fabric
        State : Completed
        Status : Success
        CliqueId : 0
        ClusterUUID : 00000000-0000-0000-0000-000000000000
        Health
            Summary : N/A
            Bandwidth : N/A
            Route Recovery in progress : N/A
            Route Unhealthy : N/A
            Access Timeout Recovery : N/A
            Incorrect Configuration : N/A
            Partition Assigned : N/A
    Processes : None
    Capabilities
        EGM : disabled
"""
