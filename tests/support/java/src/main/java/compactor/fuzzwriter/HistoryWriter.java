package compactor.fuzzwriter;

import com.fasterxml.jackson.databind.JsonNode;
import compactor.local.LocalFileIO;
import compactor.local.LocalTableOperations;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.File;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.math.BigDecimal;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.LocalDate;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.HashSet;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.Set;
import java.util.TreeMap;
import java.util.UUID;
import java.util.function.Function;
import org.apache.iceberg.BaseTable;
import org.apache.iceberg.ContentFile;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.DeleteFile;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.Files;
import org.apache.iceberg.ManifestContent;
import org.apache.iceberg.ManifestEntries;
import org.apache.iceberg.ManifestFile;
import org.apache.iceberg.ManifestFiles;
import org.apache.iceberg.ManifestReader;
import org.apache.iceberg.PartitionField;
import org.apache.iceberg.PartitionKey;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.PartitionSpecParser;
import org.apache.iceberg.RowDelta;
import org.apache.iceberg.Schema;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.SortOrder;
import org.apache.iceberg.StaticTableOperations;
import org.apache.iceberg.StructLike;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableMetadata;
import org.apache.iceberg.TableProperties;
import org.apache.iceberg.UpdateSchema;
import org.apache.iceberg.data.BaseDeleteLoader;
import org.apache.iceberg.data.GenericFileWriterFactory;
import org.apache.iceberg.data.GenericRecord;
import org.apache.iceberg.data.InternalRecordWrapper;
import org.apache.iceberg.data.Record;
import org.apache.iceberg.deletes.BaseDVFileWriter;
import org.apache.iceberg.deletes.EqualityDeleteWriter;
import org.apache.iceberg.deletes.PositionDelete;
import org.apache.iceberg.deletes.PositionDeleteIndex;
import org.apache.iceberg.deletes.PositionDeleteWriter;
import org.apache.iceberg.io.DataWriter;
import org.apache.iceberg.io.DeleteWriteResult;
import org.apache.iceberg.io.FileIO;
import org.apache.iceberg.io.OutputFileFactory;
import org.apache.iceberg.types.Type;
import org.apache.iceberg.types.Types;
import org.apache.iceberg.util.ContentFileUtil;
import org.apache.iceberg.util.DateTimeUtil;
import org.apache.iceberg.util.StructLikeMap;

/**
 * Writes a table history described in JSON with Apache Iceberg Java's own writers, for the
 * differential fuzzer (tests/fuzz.py), and lists what a table's snapshots reference.
 *
 * <p>Usage: {@code HistoryWriter <history.json> <table location>} writes one table and prints its
 * final metadata.json location; {@code HistoryWriter --serve} takes one JSON request a line on
 * stdin and answers one JSON line on stdout: {@code {"cmd": "write", "location": "file:/...",
 * "history": {...}}} or {@code {"cmd": "files", "metadata_location": "..."}}; each answer is
 * {@code {"ok": true, "result": {...}}} or {@code {"ok": false, "error": "..."}}.
 *
 * <p>A history (built by tests/fuzz.py, which also documents it) names columns and refers to the
 * rows of earlier appends by file label and row index; every value is already of its column's
 * type at the time of the operation. Operations: {@code append} (each file's rows fanned out into
 * one data file per partition of the current spec; to a branch when given), {@code
 * delete_positions} (file- or partition-scoped position-delete files in format v2, deletion
 * vectors merging the data file's earlier deletes in v3), {@code delete_equality} (scoped to the
 * partition of a given row in the current spec, or global: written under an unpartitioned spec
 * of the table), {@code add_column}, {@code drop_column}, {@code rename_column}, {@code promote},
 * {@code set_spec} (the whole new spec; a field keeps the id of the current spec's field of the
 * same name, else of an earlier field with the same source and transform), {@code branch}, {@code
 * tag} and {@code upgrade} (format v2 to v3). Tables use HadoopTables-style metadata files and
 * {@code file:} paths, no catalog; snapshot ids and file names depend only on the history.
 */
public final class HistoryWriter {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final HexFormat HEX = HexFormat.of();

  private final JsonNode history;
  private final String location;
  private LocalTableOperations ops;
  private Table table;
  private int commit = 0;

  /** Where each row of each appended file went: label -> row index -> (data file, position). */
  private final Map<String, List<RowLocation>> rowsOf = new HashMap<>();
  /** The current DV of each data file (format v3). */
  private final Map<String, DeleteFile> dvOf = new HashMap<>();
  /** The format-v2 position-delete files applying to each data file, until it has a DV. */
  private final Map<String, List<DeleteFile>> positionDeletesOf = new HashMap<>();
  private final Map<String, Integer> written = new TreeMap<>();

  private record RowLocation(DataFile file, long position) {}

  private HistoryWriter(JsonNode history, String location) {
    this.history = history;
    this.location = location.endsWith("/") ? location.substring(0, location.length() - 1)
        : location;
  }

  public static void main(String[] args) {
    if (args.length == 1 && args[0].equals("--serve")) {
      serve();
      return;
    }
    if (args.length != 2) {
      System.err.println("usage: HistoryWriter <history.json> <table location> | --serve");
      System.exit(2);
    }
    try {
      JsonNode history = JSON.readTree(new File(args[0]));
      ObjectNode result = write(history, args[1]);
      PrintStream out = new PrintStream(System.out, false, StandardCharsets.UTF_8);
      out.println(result.get("metadata_location").asText());
      out.flush();
    } catch (Throwable e) {
      System.err.print(failure(e));
      System.exit(1);
    }
  }

  /** One request a line until stdin closes; a failed request answers its error only. */
  static void serve() {
    PrintStream protocol =
        new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);
    System.setOut(System.err);
    try (BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
      for (String line = in.readLine(); line != null; line = in.readLine()) {
        if (line.isBlank()) {
          continue;
        }
        ObjectNode answer = JSON.createObjectNode();
        try {
          JsonNode request = JSON.readTree(line);
          String cmd = request.path("cmd").asText();
          ObjectNode result = switch (cmd) {
            case "write" -> write(request.get("history"), request.get("location").asText());
            case "files" -> files(request.get("metadata_location").asText());
            default -> throw new IllegalArgumentException("unknown cmd " + cmd);
          };
          answer.put("ok", true).set("result", result);
        } catch (Throwable e) {
          answer.put("ok", false).put("error", failure(e));
        }
        protocol.println(JSON.writeValueAsString(answer));
        protocol.flush();
        if (protocol.checkError()) {
          return;
        }
      }
    } catch (IOException e) {
      System.err.println("HistoryWriter server: reading stdin: " + e);
      System.exit(1);
    }
  }

  private static String failure(Throwable e) {
    StringWriter text = new StringWriter();
    PrintWriter writer = new PrintWriter(text);
    writer.println("HistoryWriter failed: " + e);
    for (Throwable cause = e.getCause(); cause != null; cause = cause.getCause()) {
      writer.println("caused by: " + cause);
    }
    e.printStackTrace(writer);
    writer.flush();
    return text.toString();
  }

  // ------------------------------------------------------------------------------------------
  // Writing a history
  // ------------------------------------------------------------------------------------------

  static ObjectNode write(JsonNode history, String location) throws IOException {
    HistoryWriter writer = new HistoryWriter(history, location);
    writer.run();
    ObjectNode result = JSON.createObjectNode();
    TableMetadata current = writer.ops.current();
    result.put("metadata_location", current.metadataFileLocation());
    result.put("format_version", current.formatVersion());
    result.put("commits", writer.commit);
    result.put("specs", current.specs().size());
    result.put("snapshots", current.snapshots().size());
    ObjectNode counts = result.putObject("written");
    writer.written.forEach(counts::put);
    return result;
  }

  private void run() throws IOException {
    List<Types.NestedField> columns = new ArrayList<>();
    int id = 1;
    for (JsonNode column : history.get("schema")) {
      columns.add(Types.NestedField.optional(
          id++, column.get("name").asText(), Types.fromPrimitiveString(column.get("type").asText())));
    }
    Schema schema = new Schema(columns);
    PartitionSpec spec = specOf(schema, history.get("spec"), Map.of(), 0);
    Map<String, String> properties = new TreeMap<>();
    properties.put(TableProperties.FORMAT_VERSION, history.get("format_version").asText());
    history.path("properties").properties()
        .forEach(p -> properties.put(p.getKey(), p.getValue().asText()));
    long seed = history.path("seed").asLong();
    ops = new LocalTableOperations(location, new Random(seed * 31 + 17));
    TableMetadata metadata = TableMetadata.newTableMetadata(
        schema, spec, SortOrder.unsorted(), location, properties);
    ops.commit(null, metadata);
    table = new BaseTable(ops, "fuzz.history");
    for (JsonNode op : history.get("ops")) {
      String kind = op.get("op").asText();
      switch (kind) {
        case "append" -> append(op);
        case "delete_positions" -> deletePositions(op);
        case "delete_equality" -> deleteEquality(op);
        case "add_column", "drop_column", "rename_column", "promote" -> updateSchema(kind, op);
        case "set_spec" -> setSpec(op);
        case "branch" -> table.manageSnapshots()
            .createBranch(op.get("name").asText(), table.currentSnapshot().snapshotId()).commit();
        case "tag" -> table.manageSnapshots()
            .createTag(op.get("name").asText(), table.currentSnapshot().snapshotId()).commit();
        case "upgrade" -> {
          table.updateProperties().set(TableProperties.FORMAT_VERSION, "3").commit();
          if (ops.current().formatVersion() != 3) {
            throw new IllegalStateException("not upgraded: v" + ops.current().formatVersion());
          }
        }
        default -> throw new IllegalArgumentException("unknown op " + kind);
      }
      table.refresh();
    }
  }

  /** Appends each file's rows, one data file per partition of the current spec. */
  private void append(JsonNode op) throws IOException {
    Schema schema = table.schema();
    PartitionSpec spec = table.spec();
    OutputFileFactory files = fileFactory();
    GenericFileWriterFactory factory = new GenericFileWriterFactory.Builder(table)
        .dataFileFormat(FileFormat.PARQUET).deleteFileFormat(FileFormat.PARQUET).build();
    RowDelta delta = table.newRowDelta();
    if (op.hasNonNull("branch")) {
      delta = delta.toBranch(op.get("branch").asText());
    }
    for (JsonNode file : op.get("files")) {
      List<Record> rows = new ArrayList<>();
      for (JsonNode row : file.get("rows")) {
        rows.add(record(schema, row));
      }
      // Fan out by partition, in order of first appearance.
      PartitionKey key = new PartitionKey(spec, schema);
      InternalRecordWrapper internal = new InternalRecordWrapper(schema.asStruct());
      StructLikeMap<Integer> slot = StructLikeMap.create(spec.partitionType());
      List<StructLike> partitions = new ArrayList<>();
      List<List<Integer>> members = new ArrayList<>();
      if (rows.isEmpty()) {
        // An empty data file, in the partition of the given row.
        key.partition(internal.wrap(record(schema, file.get("partition_row"))));
        partitions.add(spec.fields().isEmpty() ? null : key.copy());
        members.add(List.of());
      }
      for (int i = 0; i < rows.size(); i++) {
        key.partition(internal.wrap(rows.get(i)));
        StructLike partition = spec.fields().isEmpty() ? null : key.copy();
        Integer at = partition == null ? (partitions.isEmpty() ? null : 0) : slot.get(partition);
        if (at == null) {
          at = partitions.size();
          if (partition != null) {
            slot.put(partition, at);
          }
          partitions.add(partition);
          members.add(new ArrayList<>());
        }
        members.get(at).add(i);
      }
      RowLocation[] locations = new RowLocation[rows.size()];
      for (int p = 0; p < partitions.size(); p++) {
        StructLike partition = partitions.get(p);
        if (members.get(p).isEmpty()) {
          delta.addRows(count(emptyDataFile(factory, files, spec, partition)));
          continue;
        }
        DataWriter<Record> writer =
            factory.newDataWriter(files.newOutputFile(spec, partition), spec, partition);
        try (DataWriter<Record> w = writer) {
          for (int i : members.get(p)) {
            w.write(rows.get(i));
          }
        }
        DataFile dataFile = count(writer.toDataFile());
        long position = 0;
        for (int i : members.get(p)) {
          locations[i] = new RowLocation(dataFile, position++);
        }
        delta.addRows(dataFile);
      }
      rowsOf.put(file.get("label").asText(), List.of(locations));
    }
    delta.commit();
    commit++;
  }

  /**
   * A data file without rows: a Parquet footer and no row group. Iceberg's Parquet writer creates
   * no file at all when given no rows, though it reports one, so the writer is made to start the
   * file first (private members of Iceberg 1.11's DataWriter and ParquetWriter, by reflection).
   */
  private DataFile emptyDataFile(
      GenericFileWriterFactory factory, OutputFileFactory files, PartitionSpec spec,
      StructLike partition) throws IOException {
    DataWriter<Record> writer =
        factory.newDataWriter(files.newOutputFile(spec, partition), spec, partition);
    try (DataWriter<Record> w = writer) {
      Field field = DataWriter.class.getDeclaredField("appender");
      field.setAccessible(true);
      Object appender = field.get(w);
      Method start = appender.getClass().getDeclaredMethod("ensureWriterInitialized");
      start.setAccessible(true);
      start.invoke(appender);
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("cannot start an empty Parquet file: " + e, e);
    }
    return writer.toDataFile();
  }

  /** The rows targeted, by data file location (ordered), as positions (ordered). */
  private Map<String, TreeMap<Long, DataFile>> targets(JsonNode op) {
    Map<String, TreeMap<Long, DataFile>> byFile = new TreeMap<>();
    for (JsonNode target : op.get("targets")) {
      List<RowLocation> rows = rowsOf.get(target.get("file").asText());
      if (rows == null) {
        throw new IllegalArgumentException("no file labelled " + target.get("file"));
      }
      for (JsonNode index : target.get("rows")) {
        RowLocation row = rows.get(index.asInt());
        byFile.computeIfAbsent(row.file().location(), f -> new TreeMap<>())
            .put(row.position(), row.file());
      }
    }
    return byFile;
  }

  private void deletePositions(JsonNode op) throws IOException {
    if (ops.current().formatVersion() >= 3) {
      deletionVectors(op);
      return;
    }
    boolean partitionScoped = op.path("scope").asText().equals("partition");
    Map<String, TreeMap<Long, DataFile>> byFile = targets(op);
    // Groups of data files, each written into one delete file: per file, or per partition.
    Map<Integer, StructLikeMap<List<String>>> byPartition = new TreeMap<>();
    List<List<String>> groups = new ArrayList<>();
    for (Map.Entry<String, TreeMap<Long, DataFile>> e : byFile.entrySet()) {
      DataFile file = e.getValue().firstEntry().getValue();
      if (!partitionScoped) {
        groups.add(List.of(e.getKey()));
        continue;
      }
      StructLikeMap<List<String>> bySpec = byPartition.computeIfAbsent(
          file.specId(), id -> StructLikeMap.create(table.specs().get(id).partitionType()));
      List<String> group = bySpec.get(file.partition());
      if (group == null) {
        group = new ArrayList<>();
        bySpec.put(file.partition(), group);
        groups.add(group);
      }
      group.add(e.getKey());
    }
    OutputFileFactory files = fileFactory();
    GenericFileWriterFactory factory = new GenericFileWriterFactory.Builder(table)
        .dataFileFormat(FileFormat.PARQUET).deleteFileFormat(FileFormat.PARQUET).build();
    RowDelta delta = table.newRowDelta();
    for (List<String> group : groups) {
      DataFile first = byFile.get(group.get(0)).firstEntry().getValue();
      PartitionSpec spec = table.specs().get(first.specId());
      StructLike partition = spec.fields().isEmpty() ? null : first.partition();
      PositionDeleteWriter<Record> writer =
          factory.newPositionDeleteWriter(files.newOutputFile(spec, partition), spec, partition);
      try (PositionDeleteWriter<Record> w = writer) {
        for (String path : group) {
          for (Long position : byFile.get(path).keySet()) {
            PositionDelete<Record> delete = PositionDelete.create();
            w.write(delete.set(path, position));
          }
        }
      }
      DeleteFile deletes = count(writer.toDeleteFile());
      for (String path : group) {
        positionDeletesOf.computeIfAbsent(path, p -> new ArrayList<>()).add(deletes);
      }
      delta.addDeletes(deletes);
    }
    delta.commit();
    commit++;
  }

  /** Deletion vectors: one Puffin file, a DV per data file merging its earlier deletes. */
  private void deletionVectors(JsonNode op) throws IOException {
    Map<String, TreeMap<Long, DataFile>> byFile = targets(op);
    OutputFileFactory puffins = OutputFileFactory.builderFor(table, 2, commit)
        .format(FileFormat.PUFFIN)
        .operationId(operationId())
        .build();
    BaseDeleteLoader loader = new BaseDeleteLoader(f -> table.io().newInputFile(f.location()));
    Function<String, PositionDeleteIndex> previous = path -> {
      DeleteFile dv = dvOf.get(path);
      if (dv != null) {
        return loader.loadPositionDeletes(List.of(dv), path);
      }
      List<DeleteFile> v2 = positionDeletesOf.get(path);
      return v2 == null ? null : loader.loadPositionDeletes(v2, path);
    };
    BaseDVFileWriter writer = new BaseDVFileWriter(puffins, previous);
    try (BaseDVFileWriter w = writer) {
      for (Map.Entry<String, TreeMap<Long, DataFile>> e : byFile.entrySet()) {
        for (Map.Entry<Long, DataFile> row : e.getValue().entrySet()) {
          DataFile file = row.getValue();
          PartitionSpec spec = table.specs().get(file.specId());
          w.delete(e.getKey(), row.getKey(), spec,
              spec.fields().isEmpty() ? null : file.partition());
        }
      }
    }
    DeleteWriteResult result = writer.result();
    RowDelta delta =
        table.newRowDelta().validateFromSnapshot(table.currentSnapshot().snapshotId());
    for (DeleteFile dv : result.deleteFiles()) {
      delta.addDeletes(count(dv));
      dvOf.put(dv.referencedDataFile(), dv);
      positionDeletesOf.remove(dv.referencedDataFile());
    }
    for (DeleteFile old : result.rewrittenDeleteFiles()) {
      delta.removeDeletes(old);
      written.merge(old.format() == FileFormat.PUFFIN ? "replaced_dvs"
          : "replaced_position_delete_files", 1, Integer::sum);
    }
    delta.commit();
    commit++;
  }

  /** Equality deletes on the given columns: in one row's partition, or global. */
  private void deleteEquality(JsonNode op) throws IOException {
    Schema schema = table.schema();
    List<String> names = new ArrayList<>();
    op.get("columns").forEach(c -> names.add(c.asText()));
    Schema keySchema = schema.select(names);
    int[] ids = names.stream().mapToInt(n -> schema.findField(n).fieldId()).toArray();
    PartitionSpec spec;
    StructLike partition;
    if (op.path("scope").asText().equals("global")) {
      spec = table.specs().values().stream()
          .filter(PartitionSpec::isUnpartitioned)
          .min(Comparator.comparingInt(PartitionSpec::specId))
          .orElseThrow(() -> new IllegalStateException("no unpartitioned spec for a global delete"));
      partition = spec.fields().isEmpty() ? null : GenericRecord.create(spec.partitionType());
    } else {
      spec = table.spec();
      PartitionKey key = new PartitionKey(spec, schema);
      key.partition(new InternalRecordWrapper(schema.asStruct())
          .wrap(record(schema, op.get("partition_row"))));
      partition = spec.fields().isEmpty() ? null : key.copy();
    }
    GenericFileWriterFactory factory = new GenericFileWriterFactory.Builder(table)
        .dataFileFormat(FileFormat.PARQUET)
        .deleteFileFormat(FileFormat.PARQUET)
        .equalityFieldIds(ids)
        .equalityDeleteRowSchema(keySchema)
        .build();
    OutputFileFactory files = fileFactory();
    EqualityDeleteWriter<Record> writer =
        factory.newEqualityDeleteWriter(files.newOutputFile(spec, partition), spec, partition);
    try (EqualityDeleteWriter<Record> w = writer) {
      for (JsonNode key : op.get("keys")) {
        GenericRecord record = GenericRecord.create(keySchema);
        for (int i = 0; i < names.size(); i++) {
          Types.NestedField field = keySchema.findField(names.get(i));
          record.setField(field.name(), value(field.type(), key.get(i)));
        }
        w.write(record);
      }
    }
    table.newRowDelta().addDeletes(count(writer.toDeleteFile())).commit();
    commit++;
  }

  private void updateSchema(String kind, JsonNode op) {
    String name = op.get("name").asText();
    UpdateSchema update = table.updateSchema();
    switch (kind) {
      case "add_column" -> update.addColumn(name, Types.fromPrimitiveString(op.get("type").asText()));
      case "drop_column" -> update.deleteColumn(name);
      case "rename_column" -> update.renameColumn(name, op.get("to").asText());
      case "promote" -> update.updateColumn(
          name, Types.fromPrimitiveString(op.get("type").asText()));
      default -> throw new IllegalArgumentException(kind);
    }
    update.commit();
  }

  /** Replaces the default spec, as a catalog commit of a new spec does. */
  private void setSpec(JsonNode op) {
    TableMetadata base = ops.current();
    Map<String, Integer> byName = new HashMap<>();
    base.spec().fields().forEach(f -> byName.put(f.name(), f.fieldId()));
    PartitionSpec spec = specOf(base.schema(), op.get("fields"), byName, base.lastAssignedPartitionId());
    ops.commit(base, base.updatePartitionSpec(spec));
  }

  /**
   * A spec of the given fields (source column name, transform, name). A field keeps the id of
   * {@code currentIds}' field of its name, else takes the id of an earlier spec's field of the
   * same source and transform (as Iceberg recycles them), else a new one.
   */
  private PartitionSpec specOf(
      Schema schema, JsonNode fields, Map<String, Integer> currentIds, int lastAssigned) {
    Map<String, Integer> earlier = new HashMap<>();
    if (ops != null) {
      for (PartitionSpec old : ops.current().specs()) {
        for (PartitionField f : old.fields()) {
          if (!f.transform().isVoid()) {
            earlier.putIfAbsent(f.sourceId() + "/" + f.transform(), f.fieldId());
          }
        }
      }
    }
    int next = Math.max(lastAssigned, 999);
    ObjectNode json = JSON.createObjectNode();
    json.put("spec-id", 0);
    ArrayNode out = json.putArray("fields");
    Set<Integer> used = new HashSet<>();
    for (JsonNode field : fields) {
      String name = field.get("name").asText();
      String transform = field.get("transform").asText();
      int sourceId = schema.findField(field.get("source").asText()).fieldId();
      Integer id = currentIds.get(name);
      if (id == null && !transform.equals("void")) {
        id = earlier.get(sourceId + "/" + transform);
        if (id != null && currentIds.containsValue(id)) {
          id = null; // held by a field of another name in the current spec
        }
      }
      if (id == null || used.contains(id)) {
        id = ++next;
      }
      used.add(id);
      out.addObject()
          .put("name", name)
          .put("transform", transform)
          .put("source-id", sourceId)
          .put("field-id", id);
    }
    return PartitionSpecParser.fromJson(schema, json);
  }

  // ------------------------------------------------------------------------------------------
  // Values
  // ------------------------------------------------------------------------------------------

  private static Record record(Schema schema, JsonNode row) {
    GenericRecord record = GenericRecord.create(schema);
    if (row == null) {
      return record;
    }
    for (Types.NestedField field : schema.columns()) {
      record.setField(field.name(), value(field.type(), row.get(field.name())));
    }
    return record;
  }

  /**
   * One value as the history encodes it: floats as the hex of their IEEE bits (8 digits for
   * float, 16 for double, so NaN payloads and -0.0 survive), decimals as plain strings, dates as
   * days, times and timestamps as microseconds, binary and fixed as hex.
   */
  static Object value(Type type, JsonNode v) {
    if (v == null || v.isNull()) {
      return null;
    }
    return switch (type.typeId()) {
      case BOOLEAN -> v.asBoolean();
      case INTEGER -> v.intValue();
      case LONG -> v.longValue();
      case FLOAT -> Float.intBitsToFloat(Integer.parseUnsignedInt(v.asText(), 16));
      case DOUBLE -> Double.longBitsToDouble(Long.parseUnsignedLong(v.asText(), 16));
      case DECIMAL -> new BigDecimal(v.asText())
          .setScale(((Types.DecimalType) type).scale(), java.math.RoundingMode.UNNECESSARY);
      case STRING -> v.asText();
      case UUID -> UUID.fromString(v.asText());
      case DATE -> LocalDate.ofEpochDay(v.longValue());
      case TIME -> DateTimeUtil.timeFromMicros(v.longValue());
      case TIMESTAMP -> ((Types.TimestampType) type).shouldAdjustToUTC()
          ? DateTimeUtil.timestamptzFromMicros(v.longValue())
          : DateTimeUtil.timestampFromMicros(v.longValue());
      case BINARY -> ByteBuffer.wrap(HEX.parseHex(v.asText()));
      case FIXED -> HEX.parseHex(v.asText());
      default -> throw new IllegalArgumentException("unsupported type " + type);
    };
  }

  // ------------------------------------------------------------------------------------------
  // Files
  // ------------------------------------------------------------------------------------------

  private String operationId() {
    return String.format("h%d-c%03d", history.path("seed").asLong(), commit);
  }

  private OutputFileFactory fileFactory() {
    return OutputFileFactory.builderFor(table, 1, commit)
        .format(FileFormat.PARQUET)
        .operationId(operationId())
        .build();
  }

  private <F extends ContentFile<F>> F count(F file) {
    String kind = switch (file.content()) {
      case DATA -> file.recordCount() == 0 ? "empty_data_files" : "data_files";
      case EQUALITY_DELETES -> "equality_delete_files";
      case POSITION_DELETES -> file.format() == FileFormat.PUFFIN ? "dvs"
          : ContentFileUtil.isFileScoped((DeleteFile) file) ? "file_position_delete_files"
          : "partition_position_delete_files";
      default -> throw new IllegalStateException("content " + file.content());
    };
    written.merge(kind, 1, Integer::sum);
    return file;
  }

  /**
   * Every file the table's snapshots reference, checked to exist: each snapshot's manifest list,
   * its manifests and their live data and delete files.
   */
  static ObjectNode files(String metadataLocation) throws IOException {
    FileIO io = new LocalFileIO();
    Table table = new BaseTable(new StaticTableOperations(metadataLocation, io), "checked");
    Map<String, String> referenced = new LinkedHashMap<>();
    Map<String, Long> firstSnapshot = new HashMap<>();
    for (Snapshot snapshot : table.snapshots()) {
      long id = snapshot.snapshotId();
      firstSnapshot.putIfAbsent(snapshot.manifestListLocation(), id);
      referenced.putIfAbsent(snapshot.manifestListLocation(), "manifest_list");
      if (!io.newInputFile(snapshot.manifestListLocation()).exists()) {
        continue; // reported below; its manifests cannot be known
      }
      for (ManifestFile manifest : snapshot.allManifests(io)) {
        firstSnapshot.putIfAbsent(manifest.path(), id);
        if (referenced.putIfAbsent(manifest.path(), "manifest") != null
            || !io.newInputFile(manifest.path()).exists()) {
          continue;
        }
        ManifestReader<?> reader = manifest.content() == ManifestContent.DATA
            ? ManifestFiles.read(manifest, io, table.specs())
            : ManifestFiles.readDeleteManifest(manifest, io, table.specs());
        ManifestEntries.forEach(reader, entry -> {
          if (entry.status() != 2) {
            String kind = switch (entry.file().content()) {
              case DATA -> "data";
              case EQUALITY_DELETES -> "equality_deletes";
              case POSITION_DELETES -> entry.file().format() == FileFormat.PUFFIN
                  ? "deletion_vectors" : "position_deletes";
              default -> String.valueOf(entry.file().content());
            };
            String path = entry.file().location();
            firstSnapshot.putIfAbsent(path, id);
            referenced.putIfAbsent(path, kind);
          }
        });
      }
    }
    ObjectNode result = JSON.createObjectNode();
    result.put("referenced", referenced.size());
    ArrayNode missing = result.putArray("missing");
    for (Map.Entry<String, String> e : referenced.entrySet()) {
      if (!io.newInputFile(e.getKey()).exists()) {
        missing.addObject()
            .put("path", e.getKey())
            .put("kind", e.getValue())
            .put("snapshot", firstSnapshot.get(e.getKey()));
      }
    }
    return result;
  }
}
