package compactor.cdcwriter;

import compactor.local.LocalTableOperations;
import compactor.readcheck.IcebergReadCheck;
import java.io.File;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.LocalDate;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Comparator;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.function.Function;
import java.util.function.Predicate;
import org.apache.iceberg.BaseTable;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.DeleteFile;
import org.apache.iceberg.FileContent;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.Files;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.RowDelta;
import org.apache.iceberg.Schema;
import org.apache.iceberg.SortOrder;
import org.apache.iceberg.StructLike;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableMetadata;
import org.apache.iceberg.TableProperties;
import org.apache.iceberg.data.BaseDeleteLoader;
import org.apache.iceberg.data.GenericFileWriterFactory;
import org.apache.iceberg.data.GenericRecord;
import org.apache.iceberg.data.Record;
import org.apache.iceberg.deletes.BaseDVFileWriter;
import org.apache.iceberg.deletes.EqualityDeleteWriter;
import org.apache.iceberg.deletes.PositionDelete;
import org.apache.iceberg.deletes.PositionDeleteIndex;
import org.apache.iceberg.deletes.PositionDeleteWriter;
import org.apache.iceberg.io.DataWriter;
import org.apache.iceberg.io.DeleteWriteResult;
import org.apache.iceberg.io.OutputFileFactory;
import org.apache.iceberg.types.Types;
import org.apache.iceberg.util.ContentFileUtil;

/**
 * Writes a small change-data-capture table with Apache Iceberg Java's own writers, for tests.
 *
 * <p>Usage: {@code CdcTableWriter <scenario> <table location> <seed> <expected.json>}. The table
 * is written at the location (a {@code file:} URI or a plain path) with HadoopTables-style
 * metadata ({@code metadata/vN.metadata.json} and {@code metadata/version-hint.text}), no catalog.
 * The live rows the writer's own in-memory model expects, in the canonical form of {@link
 * IcebergReadCheck#canon}, go to expected.json; the final metadata.json location is printed.
 *
 * <p>Scenarios (see tests/java_writer.py for what each one holds): upsert, merge-on-read, dv,
 * void-spec, schema-change, v2-to-v3, v2-upgraded. Rows, keys, files, file names and snapshot ids
 * depend only on the seed (and the scenario); timestamps and the table uuid do not.
 */
public final class CdcTableWriter {
  static final List<String> SCENARIOS =
      List.of("upsert", "merge-on-read", "dv", "void-spec", "schema-change", "v2-to-v3",
          "v2-upgraded");
  private static final String[] REGIONS = {"eu", "us", "apac", "latam"};
  private static final LocalDate DAY0 = LocalDate.of(2024, 1, 1);

  private final String scenario;
  private final String location;
  private final long seed;
  private final Random rnd;
  private final Random ids;
  private LocalTableOperations ops;
  private Table table;
  private int commit = 0;

  /** The live rows by key: field id to value. */
  private final TreeMap<Long, Map<Integer, Object>> live = new TreeMap<>();
  /** Keys deleted and not (yet) inserted again. */
  private final TreeSet<Long> deleted = new TreeSet<>();
  private long nextId = 0;
  /** Where each live row is: data file location and position (merge-on-read, dv). */
  private final Map<Long, String> fileOf = new HashMap<>();
  private final Map<Long, Long> posOf = new HashMap<>();
  /** Keys by position of every data file written. */
  private final Map<String, List<Long>> keysOf = new LinkedHashMap<>();
  private final Map<String, DataFile> dataFiles = new LinkedHashMap<>();
  /** The current DV of each data file (dv, v2-to-v3). */
  private final Map<String, DeleteFile> dvOf = new HashMap<>();
  /** The live position-delete files (format v2) referencing each data file, until it has a DV. */
  private final Map<String, List<DeleteFile>> posDeletesOf = new TreeMap<>();
  private final Map<String, Integer> written = new TreeMap<>();

  private CdcTableWriter(String scenario, String location, long seed) {
    this.scenario = scenario;
    this.location = location.endsWith("/") ? location.substring(0, location.length() - 1)
        : location;
    this.seed = seed;
    this.rnd = new Random(seed * 1_000_003L + scenario.hashCode());
    this.ids = new Random(~seed * 7_919L + scenario.hashCode());
  }

  /** Writes one table per group of four arguments, in one JVM; prints each metadata.json. */
  public static void main(String[] args) {
    boolean valid = args.length > 0 && args.length % 4 == 0;
    for (int i = 0; valid && i < args.length; i += 4) {
      valid = SCENARIOS.contains(args[i]);
    }
    if (!valid) {
      System.err.println(
          "usage: CdcTableWriter (<" + String.join("|", SCENARIOS)
              + "> <table location> <seed> <expected.json>)...");
      System.exit(2);
    }
    try {
      PrintStream out = new PrintStream(System.out, false, StandardCharsets.UTF_8);
      for (int i = 0; i < args.length; i += 4) {
        CdcTableWriter writer =
            new CdcTableWriter(args[i], args[i + 1], Long.parseLong(args[i + 2]));
        writer.write();
        writer.writeExpected(args[i + 3]);
        out.println(writer.ops.current().metadataFileLocation());
      }
      out.flush();
    } catch (Throwable e) {
      System.err.println("CdcTableWriter failed: " + e);
      e.printStackTrace(System.err);
      System.exit(1);
    }
  }

  // ------------------------------------------------------------------------------------------
  // Scenarios
  // ------------------------------------------------------------------------------------------

  private static Schema baseSchema() {
    return new Schema(
        Types.NestedField.required(1, "id", Types.LongType.get()),
        Types.NestedField.required(2, "region", Types.StringType.get()),
        Types.NestedField.optional(3, "name", Types.StringType.get()),
        Types.NestedField.optional(4, "amount", Types.DoubleType.get()),
        Types.NestedField.optional(5, "qty", Types.IntegerType.get()),
        Types.NestedField.optional(6, "day", Types.DateType.get()));
  }

  private void write() throws IOException {
    switch (scenario) {
      case "upsert" -> upsert();
      case "merge-on-read" -> mergeOnRead();
      case "dv" -> deletionVectors();
      case "void-spec" -> voidSpec();
      case "schema-change" -> schemaChange();
      case "v2-to-v3" -> v2ToV3(true);
      case "v2-upgraded" -> v2ToV3(false);
      default -> throw new IllegalArgumentException(scenario);
    }
  }

  /** Flink-style upserts in 4 identity(region) partitions: ~30 commits. */
  private void upsert() throws IOException {
    Schema schema = baseSchema();
    create(schema, PartitionSpec.builderFor(schema).identity("region").build(), 2);
    cdcCommit(newKeys(160), List.of());
    for (int c = 1; c < 30; c++) {
      switch (c % 5) {
        case 3 -> cdcCommit(List.of(), liveKeys(8 + rnd.nextInt(12)));
        case 4 -> {
          List<Long> keys = deletedKeys(6 + rnd.nextInt(8));
          keys.addAll(liveKeys(5));
          cdcCommit(keys, List.of());
        }
        default -> {
          List<Long> keys = liveKeys(12 + rnd.nextInt(20));
          keys.addAll(newKeys(5 + rnd.nextInt(10)));
          keys.addAll(deletedKeys(rnd.nextInt(3)));
          // Upserted twice in one commit: Flink deletes the first insert by position.
          for (int i = 0, n = Math.min(3, keys.size()); i < n; i++) {
            keys.add(keys.get(rnd.nextInt(keys.size())));
          }
          cdcCommit(keys, liveKeys(rnd.nextInt(4)));
        }
      }
    }
  }

  /** Spark merge-on-read: appends, then position deletes (file- and partition-scoped). */
  private void mergeOnRead() throws IOException {
    Schema schema = baseSchema();
    create(schema, PartitionSpec.builderFor(schema).identity("region").build(), 2);
    int regions = 3;
    for (int c = 0; c < 4; c++) {
      appendCommit(newKeys(90 * regions), regions);
    }
    for (int c = 0; c < 6; c++) {
      boolean partitionScoped = c % 2 == 0;
      List<Long> victims = liveKeys(25 + rnd.nextInt(25));
      // Updates (c odd): the deleted rows come back with new values in a new data file.
      List<Long> updated = c % 2 == 1 ? new ArrayList<>(victims.subList(0, victims.size() / 2))
          : List.of();
      positionDeleteCommit(victims, updated, partitionScoped);
    }
  }

  /** v3 deletion vectors: appends, then DVs; later DVs replace earlier ones of the same file. */
  private void deletionVectors() throws IOException {
    Schema schema = baseSchema();
    create(schema, PartitionSpec.builderFor(schema).identity("region").build(), 3);
    int regions = 3;
    for (int c = 0; c < 3; c++) {
      appendCommit(newKeys(100 * regions), regions);
    }
    for (int c = 0; c < 6; c++) {
      List<Long> victims = liveKeys(20 + rnd.nextInt(30));
      List<Long> updated = c % 3 == 2 ? new ArrayList<>(victims.subList(0, victims.size() / 3))
          : List.of();
      dvCommit(victims, updated);
    }
  }

  /**
   * A format v2 merge-on-read table (appends, then position deletes) upgraded to v3; with {@code
   * commitAfter}, an append and a deletion-vector commit follow the upgrade, some DVs merging the
   * v2 position deletes of their data file (file-scoped ones are removed, partition-scoped ones
   * stay: a DV makes readers ignore them for its data file).
   */
  private void v2ToV3(boolean commitAfter) throws IOException {
    Schema schema = baseSchema();
    create(schema, PartitionSpec.builderFor(schema).identity("region").build(), 2);
    int regions = 3;
    for (int c = 0; c < 3; c++) {
      appendCommit(newKeys(60 * regions), regions);
    }
    positionDeleteCommit(liveKeys(30 + rnd.nextInt(10)), List.of(), true);
    // An UPDATE of keys of the first two appends: the third's files keep partition-scoped deletes.
    List<Long> victims = pick(live.headMap(2L * 60 * regions).keySet(), 20 + rnd.nextInt(10));
    positionDeleteCommit(victims, new ArrayList<>(victims.subList(0, victims.size() / 2)), false);
    // As Spark's ALTER TABLE ... SET TBLPROPERTIES ('format-version' = '3') does.
    table.updateProperties().set(TableProperties.FORMAT_VERSION, "3").commit();
    if (ops.current().formatVersion() != 3) {
      throw new IllegalStateException("not upgraded: v" + ops.current().formatVersion());
    }
    if (!commitAfter) {
      return;
    }
    appendCommit(newKeys(40 * regions), regions);
    // DVs for a data file with a file-scoped v2 delete file (merged into its DV and removed), one
    // with partition-scoped v2 deletes only (merged; the delete file stays for its other data
    // files) and data files without earlier deletes; other files keep only their v2 deletes.
    LinkedHashSet<Long> targets = new LinkedHashSet<>();
    for (boolean fileScoped : new boolean[] {true, false}) {
      String path = posDeletesOf.entrySet().stream()
          .filter(e -> e.getValue().stream().anyMatch(ContentFileUtil::isFileScoped) == fileScoped)
          .map(Map.Entry::getKey)
          .filter(fileOf::containsValue)
          .findFirst()
          .orElseThrow(() -> new IllegalStateException("no data file with v2 deletes"));
      targets.addAll(pick(keysIn(k -> path.equals(fileOf.get(k))), 4));
    }
    targets.addAll(pick(keysIn(k -> !posDeletesOf.containsKey(fileOf.get(k))), 12));
    List<Long> dvVictims = new ArrayList<>(targets);
    dvCommit(dvVictims, new ArrayList<>(dvVictims.subList(0, dvVictims.size() / 3)));
  }

  /** The live keys {@code where} holds for, ascending. */
  private List<Long> keysIn(Predicate<Long> where) {
    return live.keySet().stream().filter(where).toList();
  }

  /** Partitioned upserts, then the partition field made void: later equality deletes global. */
  private void voidSpec() throws IOException {
    Schema schema = baseSchema();
    create(schema, PartitionSpec.builderFor(schema).identity("region").build(), 2);
    cdcCommit(newKeys(300), List.of());
    for (int c = 0; c < 3; c++) {
      List<Long> keys = liveKeys(30);
      keys.addAll(newKeys(10));
      cdcCommit(keys, liveKeys(5));
    }
    // Format v2 keeps a removed partition field as void (UpdatePartitionSpec.removeField drops
    // it from a v2 spec instead), so the spec is built as Iceberg does it for v1 tables.
    PartitionSpec voidSpec = PartitionSpec.builderFor(schema).alwaysNull("region", "region")
        .build();
    TableMetadata base = ops.current();
    ops.commit(base, base.updatePartitionSpec(voidSpec));
    PartitionSpec spec = table.spec();
    if (spec.specId() != 1 || spec.fields().size() != 1 || !spec.fields().get(0).transform()
        .isVoid() || spec.fields().get(0).fieldId() != base.spec().fields().get(0).fieldId()) {
      throw new IllegalStateException("not a void spec keeping the field: " + spec);
    }
    cdcCommit(List.of(), liveKeys(40)); // deletes only: every one hits an old-spec file
    for (int c = 0; c < 4; c++) {
      List<Long> keys = liveKeys(25);
      keys.addAll(deletedKeys(8));
      keys.addAll(newKeys(5));
      cdcCommit(keys, liveKeys(6));
    }
  }

  /** Upserts, then a column renamed and one added, then upserts and deletes on id. */
  private void schemaChange() throws IOException {
    create(baseSchema(), PartitionSpec.unpartitioned(), 2);
    cdcCommit(newKeys(250), List.of());
    for (int c = 0; c < 3; c++) {
      List<Long> keys = liveKeys(25);
      keys.addAll(newKeys(10));
      cdcCommit(keys, liveKeys(5));
    }
    table.updateSchema()
        .renameColumn("name", "title")
        .addColumn("note", Types.StringType.get())
        .commit();
    cdcCommit(List.of(), liveKeys(40));
    for (int c = 0; c < 4; c++) {
      List<Long> keys = liveKeys(25);
      keys.addAll(deletedKeys(8));
      keys.addAll(newKeys(5));
      cdcCommit(keys, liveKeys(6));
    }
  }

  // ------------------------------------------------------------------------------------------
  // Commits
  // ------------------------------------------------------------------------------------------

  /**
   * One Flink upsert-sink checkpoint: each key of {@code upserts} (in order) is deleted, then
   * inserted with new values; each of {@code deletes} is deleted. A delete is an equality delete
   * on id in the key's partition, or, when the key was inserted earlier in this commit, a
   * position delete of that row (as Flink's BaseEqualityDeltaWriter does).
   */
  private void cdcCommit(List<Long> upserts, List<Long> deletes) throws IOException {
    Schema schema = table.schema();
    PartitionSpec spec = table.spec();
    Schema keySchema = schema.select("id");
    GenericFileWriterFactory factory =
        new GenericFileWriterFactory.Builder(table)
            .dataFileFormat(FileFormat.PARQUET)
            .deleteFileFormat(FileFormat.PARQUET)
            .equalityFieldIds(new int[] {schema.findField("id").fieldId()})
            .equalityDeleteRowSchema(keySchema)
            .build();
    OutputFileFactory files = fileFactory();
    Map<String, DataWriter<Record>> dataWriters = new TreeMap<>();
    Map<String, Long> rowsIn = new HashMap<>();
    Map<String, String> dataPaths = new HashMap<>();
    Map<String, EqualityDeleteWriter<Record>> eqWriters = new TreeMap<>();
    Map<String, List<PositionDelete<Record>>> posDeletes = new TreeMap<>();
    Map<Long, String> insertedFile = new HashMap<>();
    Map<Long, Long> insertedPos = new HashMap<>();

    List<Object[]> ops = new ArrayList<>();
    for (Long key : deletes) {
      ops.add(new Object[] {key, false});
    }
    for (Long key : upserts) {
      ops.add(new Object[] {key, true});
    }
    for (Object[] op : ops) {
      long key = (Long) op[0];
      boolean insert = (Boolean) op[1];
      String region = regionOf(key);
      String part = spec.isPartitioned() ? region : "";
      // Delete the key.
      if (insertedFile.containsKey(key)) {
        PositionDelete<Record> pd = PositionDelete.create();
        posDeletes.computeIfAbsent(part, p -> new ArrayList<>())
            .add(pd.set(insertedFile.remove(key), insertedPos.remove(key)));
      } else {
        EqualityDeleteWriter<Record> eq = eqWriters.get(part);
        if (eq == null) {
          eq = factory.newEqualityDeleteWriter(
              files.newOutputFile(spec, partition(spec, region)), spec, partition(spec, region));
          eqWriters.put(part, eq);
        }
        GenericRecord k = GenericRecord.create(keySchema);
        k.setField("id", key);
        eq.write(k);
      }
      if (live.remove(key) != null) {
        deleted.add(key);
      }
      if (!insert) {
        continue;
      }
      // Insert it again.
      Map<Integer, Object> row = newRow(key, schema);
      DataWriter<Record> data = dataWriters.get(part);
      if (data == null) {
        var out = files.newOutputFile(spec, partition(spec, region));
        data = factory.newDataWriter(out, spec, partition(spec, region));
        dataWriters.put(part, data);
        dataPaths.put(part, out.encryptingOutputFile().location());
      }
      data.write(record(schema, row));
      long pos = rowsIn.merge(part, 1L, Long::sum) - 1;
      insertedFile.put(key, dataPaths.get(part));
      insertedPos.put(key, pos);
      live.put(key, row);
      deleted.remove(key);
    }

    RowDelta delta = table.newRowDelta();
    for (DataWriter<Record> data : dataWriters.values()) {
      data.close();
      delta.addRows(count(data.toDataFile()));
    }
    for (EqualityDeleteWriter<Record> eq : eqWriters.values()) {
      eq.close();
      delta.addDeletes(count(eq.toDeleteFile()));
    }
    for (Map.Entry<String, List<PositionDelete<Record>>> e : posDeletes.entrySet()) {
      String region = e.getKey().isEmpty() ? null : e.getKey();
      PositionDeleteWriter<Record> pw =
          factory.newPositionDeleteWriter(
              files.newOutputFile(spec, partition(spec, region)), spec, partition(spec, region));
      try (PositionDeleteWriter<Record> w = pw) {
        e.getValue().sort(Comparator.comparing((PositionDelete<Record> p) -> p.path().toString())
            .thenComparingLong(PositionDelete::pos));
        for (PositionDelete<Record> pd : e.getValue()) {
          w.write(pd);
        }
      }
      delta.addDeletes(count(pw.toDeleteFile()));
    }
    delta.commit();
    commit++;
  }

  /** Appends {@code keys} as one data file per region (of the first {@code regions}). */
  private void appendCommit(List<Long> keys, int regions) throws IOException {
    RowDelta delta = table.newRowDelta();
    Map<String, List<Long>> byRegion = new TreeMap<>();
    for (Long key : keys) {
      byRegion.computeIfAbsent(REGIONS[(int) (key % regions)], r -> new ArrayList<>()).add(key);
    }
    OutputFileFactory files = fileFactory();
    GenericFileWriterFactory factory = new GenericFileWriterFactory.Builder(table)
        .dataFileFormat(FileFormat.PARQUET).deleteFileFormat(FileFormat.PARQUET).build();
    for (Map.Entry<String, List<Long>> e : byRegion.entrySet()) {
      delta.addRows(writeData(factory, files, e.getKey(), e.getValue()));
    }
    delta.commit();
    commit++;
  }

  private DataFile writeData(
      GenericFileWriterFactory factory, OutputFileFactory files, String region, List<Long> keys)
      throws IOException {
    Schema schema = table.schema();
    PartitionSpec spec = table.spec();
    var out = files.newOutputFile(spec, partition(spec, region));
    DataWriter<Record> data = factory.newDataWriter(out, spec, partition(spec, region));
    String path = out.encryptingOutputFile().location();
    List<Long> positions = new ArrayList<>();
    try (DataWriter<Record> w = data) {
      for (Long key : keys) {
        Map<Integer, Object> row = newRow(key, schema);
        row.put(2, region);
        w.write(record(schema, row));
        fileOf.put(key, path);
        lastRegion.put(key, region);
        posOf.put(key, (long) positions.size());
        positions.add(key);
        live.put(key, row);
        deleted.remove(key);
      }
    }
    DataFile file = count(data.toDataFile());
    keysOf.put(path, positions);
    dataFiles.put(path, file);
    return file;
  }

  /**
   * Deletes {@code victims} with position deletes, one file per partition referencing several
   * data files ({@code partitionScoped}) or one per data file; {@code updated} come back with
   * new values in new data files of the same commit, as Spark's merge-on-read UPDATE does.
   */
  private void positionDeleteCommit(List<Long> victims, List<Long> updated,
      boolean partitionScoped) throws IOException {
    PartitionSpec spec = table.spec();
    OutputFileFactory files = fileFactory();
    GenericFileWriterFactory factory = new GenericFileWriterFactory.Builder(table)
        .dataFileFormat(FileFormat.PARQUET).deleteFileFormat(FileFormat.PARQUET).build();
    Map<String, TreeMap<String, TreeSet<Long>>> byGroup = new TreeMap<>();
    for (Long key : victims) {
      String path = fileOf.remove(key);
      long pos = posOf.remove(key);
      String group = partitionScoped ? regionOf(path) : path;
      byGroup.computeIfAbsent(group, g -> new TreeMap<>())
          .computeIfAbsent(path, p -> new TreeSet<>()).add(pos);
      live.remove(key);
      deleted.add(key);
    }
    RowDelta delta = table.newRowDelta();
    for (TreeMap<String, TreeSet<Long>> group : byGroup.values()) {
      String region = regionOf(group.firstKey());
      PositionDeleteWriter<Record> pw = factory.newPositionDeleteWriter(
          files.newOutputFile(spec, partition(spec, region)), spec, partition(spec, region));
      try (PositionDeleteWriter<Record> w = pw) {
        for (Map.Entry<String, TreeSet<Long>> e : group.entrySet()) {
          for (Long pos : e.getValue()) {
            PositionDelete<Record> pd = PositionDelete.create();
            w.write(pd.set(e.getKey(), pos));
          }
        }
      }
      DeleteFile file = count(pw.toDeleteFile());
      for (String path : group.keySet()) {
        posDeletesOf.computeIfAbsent(path, p -> new ArrayList<>()).add(file);
      }
      delta.addDeletes(file);
    }
    addUpdatedRows(delta, factory, files, updated);
    delta.commit();
    commit++;
  }

  /**
   * Deletes {@code victims} with deletion vectors: one Puffin file, a DV per data file. A DV
   * merges the data file's earlier deletes, its DV or its v2 position-delete files (format
   * upgraded from v2), and the commit removes those that apply to that file only.
   */
  private void dvCommit(List<Long> victims, List<Long> updated) throws IOException {
    PartitionSpec spec = table.spec();
    OutputFileFactory files = fileFactory();
    OutputFileFactory puffins = OutputFileFactory.builderFor(table, 2, commit)
        .format(FileFormat.PUFFIN)
        .operationId(String.format("%s-s%d-c%02d", scenario, seed, commit))
        .build();
    BaseDeleteLoader loader = new BaseDeleteLoader(f -> table.io().newInputFile(f.location()));
    Function<String, PositionDeleteIndex> previous = path -> {
      DeleteFile dv = dvOf.get(path);
      if (dv != null) {
        return loader.loadPositionDeletes(List.of(dv), path);
      }
      List<DeleteFile> v2 = posDeletesOf.get(path);
      if (v2 == null) {
        return null;
      }
      written.merge("dvs_merging_position_deletes", 1, Integer::sum);
      return loader.loadPositionDeletes(v2, path);
    };
    BaseDVFileWriter writer = new BaseDVFileWriter(puffins, previous);
    try (BaseDVFileWriter w = writer) {
      for (Long key : victims) {
        String path = fileOf.remove(key);
        long pos = posOf.remove(key);
        w.delete(path, pos, spec, partition(spec, regionOf(path)));
        live.remove(key);
        deleted.add(key);
      }
    }
    DeleteWriteResult result = writer.result();
    // As Spark does: validate from the snapshot the DVs were based on, so the DVs replaced here
    // are not taken for concurrently added ones.
    RowDelta delta =
        table.newRowDelta().validateFromSnapshot(table.currentSnapshot().snapshotId());
    for (DeleteFile dv : result.deleteFiles()) {
      delta.addDeletes(count(dv));
      dvOf.put(dv.referencedDataFile(), dv);
      posDeletesOf.remove(dv.referencedDataFile());
    }
    for (DeleteFile old : result.rewrittenDeleteFiles()) {
      delta.removeDeletes(old);
      written.merge(old.format() == FileFormat.PUFFIN ? "replaced_dvs"
          : "replaced_position_delete_files", 1, Integer::sum);
    }
    GenericFileWriterFactory factory = new GenericFileWriterFactory.Builder(table)
        .dataFileFormat(FileFormat.PARQUET).deleteFileFormat(FileFormat.PARQUET).build();
    addUpdatedRows(delta, factory, files, updated);
    delta.commit();
    commit++;
  }

  private void addUpdatedRows(RowDelta delta, GenericFileWriterFactory factory,
      OutputFileFactory files, List<Long> updated) throws IOException {
    Map<String, List<Long>> byRegion = new TreeMap<>();
    for (Long key : updated) {
      byRegion.computeIfAbsent(regionKeyOf(key), r -> new ArrayList<>()).add(key);
    }
    for (Map.Entry<String, List<Long>> e : byRegion.entrySet()) {
      delta.addRows(writeData(factory, files, e.getKey(), e.getValue()));
    }
  }

  // ------------------------------------------------------------------------------------------
  // Rows and keys
  // ------------------------------------------------------------------------------------------

  /** Region of a key in upsert-style scenarios: fixed by the key, so the key implies it. */
  private static String regionOf(long key) {
    return REGIONS[(int) (key % REGIONS.length)];
  }

  /** Region (partition) of a data file written by this writer. */
  private String regionOf(String dataPath) {
    return (String) originalRegion.get(dataPath);
  }

  private final Map<String, Object> originalRegion = new HashMap<>();

  /** The region a deleted key's row had (merge-on-read, dv updates keep it). */
  private String regionKeyOf(long key) {
    return lastRegion.get(key);
  }

  private final Map<Long, String> lastRegion = new HashMap<>();

  private List<Long> newKeys(int n) {
    List<Long> keys = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      keys.add(nextId++);
    }
    return keys;
  }

  /** {@code n} distinct live keys (fewer if there are not enough), chosen by the seed. */
  private List<Long> liveKeys(int n) {
    return pick(live.keySet(), n);
  }

  private List<Long> deletedKeys(int n) {
    return pick(deleted, n);
  }

  private List<Long> pick(Collection<Long> from, int n) {
    List<Long> all = new ArrayList<>(from);
    List<Long> chosen = new ArrayList<>();
    while (chosen.size() < n && !all.isEmpty()) {
      chosen.add(all.remove(rnd.nextInt(all.size())));
    }
    return chosen;
  }

  /** A new version of the row of {@code key}, by field id, in {@code schema}'s columns. */
  private Map<Integer, Object> newRow(long key, Schema schema) {
    Map<Integer, Object> row = new LinkedHashMap<>();
    row.put(1, key);
    row.put(2, regionOf(key));
    row.put(3, "k" + key + "-c" + commit + "-" + Integer.toString(rnd.nextInt(1 << 20), 36));
    row.put(4, rnd.nextInt(10) == 0 ? null : (rnd.nextInt(2_000_000) - 500_000) / 100.0);
    row.put(5, rnd.nextInt(5) == 0 ? null : rnd.nextInt(1000));
    row.put(6, DAY0.plusDays(rnd.nextInt(400)));
    Types.NestedField note = schema.findField("note");
    if (note != null) {
      row.put(note.fieldId(), rnd.nextInt(3) == 0 ? null : "note-" + commit);
    }
    return row;
  }

  private static Record record(Schema schema, Map<Integer, Object> row) {
    GenericRecord record = GenericRecord.create(schema);
    for (Types.NestedField field : schema.columns()) {
      record.setField(field.name(), row.get(field.fieldId()));
    }
    return record;
  }

  /** The partition tuple of {@code region} in {@code spec} (null value for a void field). */
  private static StructLike partition(PartitionSpec spec, String region) {
    if (spec.fields().isEmpty()) {
      return null;
    }
    GenericRecord partition = GenericRecord.create(spec.partitionType());
    partition.set(0, spec.fields().get(0).transform().isVoid() ? null : region);
    return partition;
  }

  private <F extends org.apache.iceberg.ContentFile<F>> F count(F file) {
    String kind = switch (file.content()) {
      case DATA -> "data_files";
      case EQUALITY_DELETES -> "equality_delete_files";
      case POSITION_DELETES -> file.format() == FileFormat.PUFFIN ? "dvs" : "position_delete_files";
      default -> throw new IllegalStateException("content " + file.content());
    };
    written.merge(kind, 1, Integer::sum);
    if (file.content() == FileContent.DATA) {
      originalRegion.put(file.location(), file.partition() == null || file.partition().size() == 0
          ? null : file.partition().get(0, String.class));
    }
    return file;
  }

  // ------------------------------------------------------------------------------------------
  // Table, files, expected rows
  // ------------------------------------------------------------------------------------------

  private void create(Schema schema, PartitionSpec spec, int formatVersion) {
    ops = new LocalTableOperations(location, new Random(seed * 31 + scenario.hashCode() + 17));
    TableMetadata metadata = TableMetadata.newTableMetadata(
        schema, spec, SortOrder.unsorted(), location,
        Map.of("format-version", Integer.toString(formatVersion),
            "write.parquet.row-group-size-bytes", "1048576"));
    ops.commit(null, metadata);
    table = new BaseTable(ops, "cdc." + scenario);
  }

  private OutputFileFactory fileFactory() {
    return OutputFileFactory.builderFor(table, 1, commit)
        .format(FileFormat.PARQUET)
        .operationId(String.format("%s-s%d-c%02d", scenario, seed, commit))
        .build();
  }

  private void writeExpected(String path) throws IOException {
    Schema schema = table.schema();
    IcebergReadCheck.Json out = new IcebergReadCheck.Json().begin('{');
    out.key("scenario").string(scenario);
    out.key("seed").raw(Long.toString(seed));
    out.key("metadata_location").string(ops.current().metadataFileLocation());
    out.key("format_version").raw(Integer.toString(ops.current().formatVersion()));
    out.key("commits").raw(Integer.toString(commit));
    out.key("written").begin('{');
    written.forEach((k, v) -> out.key(k).raw(Integer.toString(v)));
    out.end('}');
    out.key("columns").begin('[');
    schema.columns().forEach(f -> out.string(f.name()));
    out.end(']');
    out.key("rows").begin('{');
    for (Map.Entry<Long, Map<Integer, Object>> e : live.entrySet()) {
      StringBuilder row = new StringBuilder("[");
      for (Types.NestedField field : schema.columns()) {
        if (row.length() > 1) {
          row.append(',');
        }
        IcebergReadCheck.canon(row, field.type(), e.getValue().get(field.fieldId()));
      }
      out.key(Long.toString(e.getKey())).string(row.append(']').toString());
    }
    out.end('}');
    java.nio.file.Files.writeString(
        new File(path).toPath(), out.end('}').toString() + "\n", StandardCharsets.UTF_8);
  }
}
