package compactor.readcheck;

import com.sun.management.OperatingSystemMXBean;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.util.Map;
import org.apache.iceberg.BaseTable;
import org.apache.iceberg.StaticTableOperations;
import org.apache.iceberg.Table;
import org.apache.iceberg.data.IcebergGenerics;
import org.apache.iceberg.data.Record;
import org.apache.iceberg.io.CloseableIterable;

/**
 * Times full scans of a table's current state with {@code IcebergGenerics}: every column of
 * every live row read, position deletes, equality deletes and deletion vectors applied as Iceberg
 * Java applies them (each data file's deletes loaded for that file, no cache across files). The
 * scan runs in the calling thread: {@code thread_cpu_seconds} is that thread's CPU time, {@code
 * cpu_seconds} the whole JVM's (its garbage collection and compilation included).
 *
 * <p>Usage: {@code ScanTimer <metadata.json location> <scans>}. Prints one JSON line a scan:
 * {@code {"rows": N, "seconds": S, "cpu_seconds": C, "thread_cpu_seconds": T}}; the first scans
 * warm the JVM up.
 */
public final class ScanTimer {
  private ScanTimer() {}

  public static void main(String[] args) throws Exception {
    String location = args[0];
    int scans = Integer.parseInt(args[1]);
    Table table =
        new BaseTable(
            new StaticTableOperations(location, IcebergReadCheck.fileIO(location, Map.of())),
            "timed");
    ThreadMXBean threads = ManagementFactory.getThreadMXBean();
    OperatingSystemMXBean system =
        (OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
    for (int scan = 0; scan < scans; scan++) {
      long cpu = system.getProcessCpuTime();
      long threadCpu = threads.getCurrentThreadCpuTime();
      long started = System.nanoTime();
      long rows = 0;
      try (CloseableIterable<Record> records = IcebergGenerics.read(table).build()) {
        for (Record ignored : records) {
          rows++;
        }
      }
      double seconds = (System.nanoTime() - started) / 1e9;
      double cpuSeconds = (system.getProcessCpuTime() - cpu) / 1e9;
      double threadSeconds = (threads.getCurrentThreadCpuTime() - threadCpu) / 1e9;
      System.out.printf(
          "{\"rows\": %d, \"seconds\": %.3f, \"cpu_seconds\": %.3f,"
              + " \"thread_cpu_seconds\": %.3f}%n",
          rows, seconds, cpuSeconds, threadSeconds);
    }
  }
}
